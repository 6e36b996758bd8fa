package main

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/metrics"
)

// mode is one row of the mode table: all cmd/kpr knows of a backend
// beyond its flags and its constructor. `kpr run` picks a row
// (chooseDataplane) and builds it; the switch from another mode, `kpr
// cleanup`, `kpr explain` and `kpr status` loop over the rows. A new
// backend is a new folder and one row here.
type mode struct {
	backend backend
	// fallback: --fallback-mode may name it, for nodes where eBPF
	// cannot run.
	fallback bool
	// require says what the probed kernel lacks for the mode; nil means
	// it needs no feature the probe knows (its binaries are found when
	// it is built).
	require func(loader.Report) error
	// requested is the reason logged when --mode names the mode and the
	// kernel has what it needs; refused follows the error when it does
	// not, saying what to run instead.
	requested, refused string
	// build constructs the backend. ctx ends the backend's commands
	// (iptables-restore and the like), so that kpr run exits on SIGTERM
	// without waiting for a long one.
	build func(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error)
	// leftovers removes what the mode left on the node.
	leftovers modeLeftovers
	// inspect reads what the mode holds on the node, for explain and
	// status; the error says why there is nothing of the mode's there.
	inspect func(at dataplaneAt) (dataplane.Inspector, error)
}

// modeLeftovers is how a mode's state goes once another mode serves, or
// at `kpr cleanup`.
type modeLeftovers struct {
	// remove removes the mode's state from the node, its pins under
	// bpfRoot and its records there of the network namespace at
	// netnsPath.
	remove func(bpfRoot, netnsPath string) (leftovers.Removed, error)
	// state names it in the log: "the chains an earlier iptables-mode
	// kpr left".
	state string
	// countField names Removed.Count in the log; empty when the mode
	// does not count.
	countField string
	// removed is `kpr cleanup`'s line for it.
	removed func(count int, bpfRoot string) string
}

// modes are the backends of this build, in the order explain and status
// look for their state (the eBPF mode's pins first: a kpr that switched
// to it has them before it removed the other modes' state).
var modes = []mode{
	{
		backend:   backendEBPF,
		require:   loader.Report.RequireSocketLB,
		requested: "--mode ebpf asked for it, and the kernel has every feature it needs",
		refused:   "on this node run kpr with --mode iptables, or --mode auto to fall back by itself",
		build: func(_ context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
			return newEBPFDataplane(g, f, m, log)
		},
		leftovers: modeLeftovers{
			remove:  func(bpfRoot, _ string) (leftovers.Removed, error) { return loader.RemoveLeftovers(bpfRoot) },
			state:   "any pinned programs and maps of an earlier eBPF-mode kpr",
			removed: func(_ int, bpfRoot string) string { return "removed kpr dataplane pinned under " + bpfRoot },
		},
		inspect: func(at dataplaneAt) (dataplane.Inspector, error) { return ebpfplane.OpenInspector(at.bpfRoot) },
	},
	{
		backend:   backendIPTables,
		fallback:  true,
		requested: "--mode iptables asked for it; it needs no eBPF feature",
		build: func(ctx context.Context, g *globalFlags, f *runFlags, _ *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
			return newIPTablesDataplane(ctx, g, f, log)
		},
		leftovers: modeLeftovers{
			remove: func(bpfRoot, netnsPath string) (leftovers.Removed, error) {
				return iptables.RemoveLeftovers(bpfRoot, netnsPath, netfilter.RunnerIn(context.Background(), netnsPath))
			},
			state:      "the chains an earlier iptables-mode kpr left",
			countField: "chains",
			removed:    func(n int, _ string) string { return fmt.Sprintf("removed %d kpr iptables chains", n) },
		},
		inspect: func(at dataplaneAt) (dataplane.Inspector, error) {
			return iptables.OpenInspector(at.bpfRoot, at.hostNetNS, netfilter.RunnerIn(context.Background(), at.hostNetNS), at.masquerade)
		},
	},
	{
		backend:   backendIPVS,
		fallback:  true,
		require:   requireIPVS,
		requested: "--mode ipvs asked for it; it needs no eBPF feature, and the kernel has IPVS",
		refused:   "on this node run kpr with --mode iptables, or --mode auto",
		build: func(ctx context.Context, g *globalFlags, f *runFlags, _ *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
			return newIPVSDataplane(ctx, g, f, log)
		},
		leftovers: modeLeftovers{
			remove: func(bpfRoot, netnsPath string) (leftovers.Removed, error) {
				return ipvs.RemoveLeftovers(bpfRoot, netnsPath, netfilter.RunnerIn(context.Background(), netnsPath))
			},
			state:      "the IPVS state an earlier IPVS-mode kpr left",
			countField: "virtualServers",
			removed: func(n int, _ string) string {
				return fmt.Sprintf("removed %d kpr IPVS virtual servers, the %s interface, kpr's ipsets and KPR-IPVS chains", n, ipvs.DeviceName)
			},
		},
		inspect: func(at dataplaneAt) (dataplane.Inspector, error) {
			return ipvs.OpenInspector(at.bpfRoot, at.hostNetNS, netfilter.RunnerIn(context.Background(), at.hostNetNS))
		},
	},
}

// modeOf is the row of backend b; nil if this build has none.
func modeOf(b backend) *mode {
	for i := range modes {
		if modes[i].backend == b {
			return &modes[i]
		}
	}
	return nil
}

// modeNames lists the rows' names for an error message: "a, b or c",
// with extra names (auto) first.
func modeNames(fallbackOnly bool, extra ...string) string {
	names := extra
	for _, m := range modes {
		if m.fallback || !fallbackOnly {
			names = append(names, string(m.backend))
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
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
	for _, m := range modes {
		if m.backend == b {
			continue
		}
		l := m.leftovers
		removed, err := l.remove(bpfRoot, netnsPath)
		switch {
		case err != nil:
			log.Warn("Could not remove "+l.state, zap.Error(err))
		case removed.Found && l.countField != "":
			log.Info("Removed "+l.state, zap.Int(l.countField, removed.Count))
		case removed.Found:
			log.Info("Removed "+l.state, zap.String("bpfRoot", bpfRoot))
		}
	}
}

// removeEveryModeState is `kpr cleanup`'s part for the modes: each mode's
// state goes, and each that had some says so on out.
func removeEveryModeState(out func(line string), bpfRoot, netnsPath string) error {
	for _, m := range modes {
		removed, err := m.leftovers.remove(bpfRoot, netnsPath)
		if err != nil {
			return err
		}
		if removed.Found {
			out(m.leftovers.removed(removed.Count, bpfRoot))
		}
	}
	return nil
}

// inspectDataplane opens the Inspector of the first mode whose state is on
// the node: `kpr run` removes the other modes' state once it has synced,
// so at most one is found for long.
func inspectDataplane(at dataplaneAt) (backend, dataplane.Inspector, error) {
	var why []string
	for _, m := range modes {
		in, err := m.inspect(at)
		if err == nil {
			return m.backend, in, nil
		}
		why = append(why, fmt.Sprintf("%s mode: %v", m.backend, err))
	}
	return "", nil, fmt.Errorf("no dataplane of kpr's to read: %s; kpr never ran here, or give the daemon's --bpf-root and --host-netns",
		strings.Join(why, "; "))
}
