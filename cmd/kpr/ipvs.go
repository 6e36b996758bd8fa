package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/netnsexec"
)

// ipvsFlags are the settings of --mode ipvs.
type ipvsFlags struct {
	scheduler string
}

func addIPVSFlags(fl *pflag.FlagSet, f *ipvsFlags) {
	fl.StringVar(&f.scheduler, "ipvs-scheduler", ipvs.DefaultScheduler, "IPVS scheduler of every virtual server with --mode ipvs, as kube-proxy's "+
		"(rr, wrr, lc, wlc, sh, ...; the kernel needs its ip_vs_<name> module); empty means rr")
}

// newIPVSDataplane programs IPVS, the dummy interface, the ipsets and the
// iptables rules of the node's network namespace: --host-netns, or kpr's
// own.
func newIPVSDataplane(ctx context.Context, g *globalFlags, f *runFlags, log *zap.Logger) (builtDataplane, error) {
	log = log.Named("dataplane")
	k, err := ipvs.NewNetlinkKernel(f.hostNetNS)
	if err != nil {
		return builtDataplane{}, fmt.Errorf("--mode ipvs: %w", err)
	}
	run := netfilter.RunnerIn(ctx, f.hostNetNS)
	// The same variant detection and families as the iptables mode.
	fams, err := netfilter.NodeFamilies(run, log)
	if err != nil {
		k.Close()
		return builtDataplane{}, fmt.Errorf("--mode ipvs needs iptables for masquerade and source ranges: %w", err)
	}
	cidrs, err := f.clusterCIDRs()
	if err != nil {
		k.Close()
		return builtDataplane{}, err
	}
	conntrack := netfilter.ConntrackIn(f.hostNetNS)
	sysctls := ipvs.SetSysctls
	if f.hostNetNS != "" {
		sysctls = func() error { return netnsexec.InPath(f.hostNetNS, ipvs.SetSysctls) }
	}
	if err := sysctls(); err != nil {
		log.Warn("IPVS may not masquerade or move drained UDP flows on", zap.Error(err))
	}
	netfilter.WarnWithoutBridgeNetfilter(f.hostNetNS, log)
	// Recorded before the first virtual server is written, so that a kpr
	// in another mode or `kpr cleanup` later removes it even if this one
	// crashes.
	if err := recordModeState(g.bpfRoot, f.hostNetNS, ipvsMarkerKind); err != nil {
		log.Warn("Switching this node to another mode later will leave kpr's IPVS state", zap.Error(err))
	}
	plane, err := ipvs.New(ipvs.Options{Kernel: k, Runner: run, Families: fams, Scheduler: f.ipvs.scheduler,
		Masquerade: netfilter.Masquerade{All: f.kubeProxy.masqueradeAll, ClusterCIDRs: cidrs}, Conntrack: conntrack, Log: log})
	if err != nil {
		k.Close()
		return builtDataplane{}, err
	}
	stop := make(chan struct{})
	go plane.RunReaper(ipvs.ReapInterval, stop)
	// The virtual servers stay when kpr exits, as kube-proxy's do; the
	// next kpr's first full sync takes them over.
	return builtDataplane{plane: plane, close: func() error {
		close(stop)
		k.Close()
		return nil
	}}, nil
}

// ipvsMarkerKind names the record of the IPVS mode (see iptablesMarker).
const ipvsMarkerKind = "ipvs"

// modeMarker is the record that the mode of kind wrote the network
// namespace at netnsPath: beside iptablesMarker's, in the same form.
func modeMarker(bpfRoot, netnsPath, kind string) (string, error) {
	m, err := iptablesMarker(bpfRoot, netnsPath)
	if err != nil {
		return "", err
	}
	return strings.Replace(m, "-iptables-netns-", "-"+kind+"-netns-", 1), nil
}

func recordModeState(bpfRoot, netnsPath, kind string) error {
	marker, err := modeMarker(bpfRoot, netnsPath, kind)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(marker, 0o700); err != nil {
		return fmt.Errorf("record that kpr's %s mode writes this node's network namespace (%w); "+
			"a kpr in another mode will not remove its state by itself", kind, err)
	}
	return nil
}

// removeIPVSState removes kpr's IPVS state from the namespace at netnsPath
// if the IPVS mode recorded writing it, and then the record. found says
// whether there was a record.
func removeIPVSState(bpfRoot, netnsPath string) (deleted int, found bool, err error) {
	marker, err := modeMarker(bpfRoot, netnsPath, ipvsMarkerKind)
	if err != nil {
		return 0, false, err
	}
	return removeRecordedState(marker, "kpr's IPVS state", func() (int, error) {
		k, err := ipvs.NewNetlinkKernel(netnsPath)
		if err != nil {
			return 0, err
		}
		defer k.Close()
		return ipvs.Cleanup(k, netfilter.RunnerIn(context.Background(), netnsPath))
	})
}

// cleanupIPVSMode is `kpr cleanup`'s part for the IPVS mode.
func cleanupIPVSMode(bpfRoot, netnsPath string, out io.Writer) error {
	n, found, err := removeIPVSState(bpfRoot, netnsPath)
	if err != nil {
		return err
	}
	if found {
		fmt.Fprintf(out, "removed %d kpr IPVS virtual servers, the %s interface, kpr's ipsets and KPR-IPVS chains\n", n, ipvs.DeviceName)
	}
	return nil
}

// removeIPVSModeState is removePreviousModeState's part for the IPVS
// mode's state, once another mode serves.
func removeIPVSModeState(bpfRoot, netnsPath string, log *zap.Logger) {
	n, found, err := removeIPVSState(bpfRoot, netnsPath)
	switch {
	case err != nil:
		log.Warn("Could not remove the IPVS state an earlier IPVS-mode kpr left", zap.Error(err))
	case found:
		log.Info("Removed the IPVS state an earlier IPVS-mode kpr left", zap.Int("virtualServers", n))
	}
}

// removeStateBeforeIPVS is removePreviousModeState's part for the IPVS
// mode: the eBPF mode's pins and the iptables mode's chains go.
func removeStateBeforeIPVS(bpfRoot, netnsPath string, log *zap.Logger) {
	if err := removeEBPFState(bpfRoot); err != nil {
		log.Warn("Could not remove the pinned programs and maps an earlier eBPF-mode kpr left", zap.Error(err))
	}
	n, found, err := removeIPTablesState(bpfRoot, netnsPath)
	switch {
	case err != nil:
		log.Warn("Could not remove the chains an earlier iptables-mode kpr left", zap.Error(err))
	case found:
		log.Info("Removed the chains an earlier iptables-mode kpr left", zap.Int("chains", n))
	}
}
