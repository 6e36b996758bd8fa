package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/netnsexec"
)

func newCleanupCommand(g *globalFlags) *cobra.Command {
	var cgroupRoot, hostNetNS string
	var devices []string
	var kubeProxy bool
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove the dataplane of every mode: kpr's programs, pinned maps and links, and its iptables chains",
		Long: "cleanup removes the dataplane that `kpr run` leaves in place on exit, whichever mode wrote it: " +
			"the pinned programs, maps and links of the eBPF mode, any kpr program still linked to --cgroup-root, " +
			"and the KUBE-* chains that kpr's iptables mode recorded writing in the node's network namespace " +
			"(--host-netns). Services stop being translated at once.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if kubeProxy {
				return cleanupKubeProxy(out, hostNetNS)
			}
			n, found, err := removeIPTablesState(g.bpfRoot, hostNetNS)
			if err != nil {
				return err
			}
			if found {
				fmt.Fprintf(out, "removed %d kpr iptables chains\n", n)
			}
			removeKeepNAT(out, hostNetNS)
			if err := cleanupIPVSMode(g.bpfRoot, hostNetNS, out); err != nil {
				return err
			}
			if err := removeEBPFState(g.bpfRoot); err != nil {
				return err
			}
			fmt.Fprintf(out, "removed kpr dataplane pinned under %s\n", g.bpfRoot)
			// The tcx links went with the pins; clsact filters are found
			// on the devices themselves: the named ones, or every device
			// of the node, since kpr run may have picked them itself.
			// Only kpr's own filters (and a qdisc left empty by them) go.
			where := "every device"
			if len(devices) > 0 {
				where = strings.Join(devices, ",")
			}
			removeTC := func() error { return loader.CleanupTC(g.bpfRoot, devices) }
			if hostNetNS != "" {
				err = netnsexec.InPath(hostNetNS, removeTC)
			} else {
				err = removeTC()
			}
			if err != nil {
				return fmt.Errorf("remove kpr's tc programs from %s: %w", where, err)
			}
			// Programs whose pins were lost still translate: find them
			// through the cgroup itself.
			if cgroupRoot == "" {
				root, err := loader.FindCgroup2Mount()
				if err != nil || root == "" {
					return err
				}
				cgroupRoot = root
			}
			detached, err := loader.DetachCgroup(cgroupRoot)
			if detached > 0 {
				fmt.Fprintf(out, "detached %d unpinned kpr programs from %s\n", detached, cgroupRoot)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&cgroupRoot, "cgroup-root", "", "cgroup v2 directory the programs were attached to (default: the cgroup2 root)")
	cmd.Flags().StringSliceVar(&devices, "devices", nil, "devices to remove kpr's clsact tc filters (kernels without tcx) from, with the qdisc kpr added; "+
		"empty means every device of --host-netns; tcx links go with the pins either way")
	cmd.Flags().BoolVar(&kubeProxy, "kube-proxy", false, "remove upstream kube-proxy's leftovers instead of kpr's dataplane: its iptables chains "+
		"(also kpr's iptables-mode ones, which have the same names), its nftables tables and its IPVS state; see docs/migration.md")
	cmd.Flags().StringVar(&hostNetNS, "host-netns", "", "network namespace file of the node whose iptables chains and tc filters to remove, as given to `kpr run`; empty means kpr's own")
	return cmd
}

// removeEBPFState removes the eBPF mode's pinned programs, links and maps
// under bpfRoot; nothing pinned is nothing to do.
func removeEBPFState(bpfRoot string) error {
	if err := loader.Cleanup(bpfRoot); err != nil {
		return fmt.Errorf("cleanup of %s: %w", bpfRoot, err)
	}
	return nil
}

// The iptables mode's state is in the node's netfilter tables, which other
// components write too (kubelet, the CNI plugin, maybe a kube-proxy that
// is being replaced). So kpr removes its chains only where its iptables
// mode recorded writing them: a directory beside the eBPF pins, named
// after the network namespace, created before the first rule is written.
// Like the tables it is gone after a reboot (bpffs is not persistent), and
// `kpr cleanup --bpf-root` finds it where it finds the pins. An eBPF-mode
// kpr on a node where iptables mode never ran touches no netfilter table.

// iptablesMarker is the record for the network namespace at netnsPath
// (kpr's own if empty).
func iptablesMarker(bpfRoot, netnsPath string) (string, error) {
	if bpfRoot == "" {
		bpfRoot = loader.DefaultBPFRoot
	}
	if netnsPath == "" {
		netnsPath = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(netnsPath, &st); err != nil {
		return "", fmt.Errorf("identify network namespace %s: %w", netnsPath, err)
	}
	// bpffs refuses names with a dot.
	return fmt.Sprintf("%s-iptables-netns-%d", filepath.Clean(bpfRoot), st.Ino), nil
}

// recordIPTablesState records that the iptables mode writes the tables of
// netnsPath.
func recordIPTablesState(bpfRoot, netnsPath string) error {
	marker, err := iptablesMarker(bpfRoot, netnsPath)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(marker, 0o700); err != nil {
		return fmt.Errorf("record that kpr's iptables mode writes this node's tables (%w); "+
			"an eBPF-mode kpr will not remove its chains by itself, `kpr cleanup` after a restart in eBPF mode will not either", err)
	}
	return nil
}

// removeIPTablesState removes kpr's chains from the tables of netnsPath if
// the iptables mode recorded writing them, and then the record. found says
// whether there was a record.
func removeIPTablesState(bpfRoot, netnsPath string) (deleted int, found bool, err error) {
	marker, err := iptablesMarker(bpfRoot, netnsPath)
	if err != nil {
		return 0, false, err
	}
	return removeRecordedState(marker, "the chains kpr's iptables mode wrote", func() (int, error) {
		return iptables.Cleanup(netfilter.RunnerIn(context.Background(), netnsPath))
	})
}

// removeRecordedState runs remove if the record marker says a mode wrote
// state there, and then removes the record; on failure the record stays,
// so that the next cleanup tries again. found says whether there was one.
func removeRecordedState(marker, what string, remove func() (int, error)) (deleted int, found bool, err error) {
	if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, fmt.Errorf("look for the record %s of %s: %w", marker, what, err)
	}
	deleted, err = remove()
	if err != nil {
		return deleted, true, fmt.Errorf("remove %s: %w (the record %s stays, so the next cleanup tries again)", what, err, marker)
	}
	if err := os.Remove(marker); err != nil {
		return deleted, true, fmt.Errorf("remove %s: %w", marker, err)
	}
	return deleted, true, nil
}

// removePreviousModeState removes what the other modes left once kpr's
// own dataplane serves every Service (after its first sync): until then
// the old mode's state keeps serving, and connections it carries at the
// switch go on through the state it leaves in the kernel (conntrack
// entries, translated sockets). Failures are logged, never fatal: the old
// state does no harm to the new mode's correctness.
func removePreviousModeState(firstSync <-chan struct{}, done <-chan struct{}, b backend, bpfRoot, netnsPath string, log *zap.Logger) {
	select {
	case <-firstSync:
	case <-done:
		return
	}
	if b != backendIPVS {
		removeIPVSModeState(bpfRoot, netnsPath, log)
	}
	switch b {
	case backendIPVS:
		removeStateBeforeIPVS(bpfRoot, netnsPath, log)
	case backendEBPF:
		n, found, err := removeIPTablesState(bpfRoot, netnsPath)
		switch {
		case err != nil:
			log.Warn("Could not remove the chains an earlier iptables-mode kpr left", zap.Error(err))
		case found:
			log.Info("Removed the chains an earlier iptables-mode kpr left", zap.Int("chains", n))
		}
	case backendIPTables:
		if err := removeEBPFState(bpfRoot); err != nil {
			log.Warn("Could not remove the pinned programs and maps an earlier eBPF-mode kpr left", zap.Error(err))
		} else {
			log.Info("Removed any pinned programs and maps of an earlier eBPF-mode kpr", zap.String("bpfRoot", bpfRoot))
		}
	}
}
