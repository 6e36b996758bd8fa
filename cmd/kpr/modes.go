package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/metrics"
)

// mode is one row of the mode table: all cmd/kpr knows of a backend. Each
// backend's row is in its own file here (ebpf.go, iptables.go, ipvs.go),
// with its constructor, its flags and its probe; `kpr run` picks a row
// (chooseDataplane) and builds it; the switch from another mode, `kpr
// cleanup`, `kpr explain` and `kpr status` loop over the rows. A new
// backend is a new folder, and a new file here with one row, added to
// modes.
type mode struct {
	backend backend
	// fallback: --fallback-mode may name it, for nodes where eBPF
	// cannot run.
	fallback bool
	// addFlags registers the mode's own flags of `kpr run` into its
	// part of runFlags; nil for a mode without any.
	addFlags func(fl *pflag.FlagSet, f *runFlags)
	// addCleanupFlags, if set, registers the flags of `kpr cleanup` that
	// say where its sweep looks, into the same fields as addFlags.
	addCleanupFlags func(fl *pflag.FlagSet, f *runFlags)
	// checkFlags, if set, checks the mode's flags. It runs whatever mode
	// runs, so that a value that cannot work fails on every node alike,
	// not only on the nodes that happen to run the mode.
	checkFlags func(f *runFlags) error
	// probe adds what the kernel has of the features the mode needs to
	// the report; nil for a mode that needs none the kernel can be asked
	// about. run is nil for the operators' commands; for `kpr run` it is
	// the daemon's flags, so that the probe sees the node as the
	// constructor will (the eBPF mode mounts cgroup2 first).
	probe func(r *kernelReport, run *runFlags) error
	// require says what the probed kernel lacks for the mode; nil means
	// it needs no feature the probe knows (its binaries are found when
	// it is built).
	require func(kernelReport) error
	// requested is the reason logged when --mode names the mode and the
	// kernel has what it needs; refused follows the error when it does
	// not, saying what to run instead.
	requested, refused string
	// probeNotes, if set, tells `kpr probe`'s reader what the mode does
	// on the probed kernel when --mode auto would run it.
	probeNotes func(out io.Writer, r kernelReport)
	// build constructs the backend. ctx ends the backend's commands
	// (iptables-restore and the like), so that kpr run exits on SIGTERM
	// without waiting for a long one.
	build func(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error)
	// initNode does the node setup the mode needs full privileges for
	// (sysctls, bpffs), which build does too: kube-proxy's --init-only
	// runs it alone, in an init container, and exits.
	initNode func(g *globalFlags, f *runFlags, log *zap.Logger) error
	// leftovers removes what the mode left on the node.
	leftovers modeLeftovers
	// inspect reads what the mode holds on the node, for explain and
	// status; the error says why there is nothing of the mode's there.
	inspect func(at dataplaneAt) (dataplane.Inspector, error)
	// commands, if set, are operator commands of the mode's own, which
	// read its state in its own terms (the eBPF mode's dump and trace,
	// in ebpf_*.go).
	commands func(g *globalFlags) []*cobra.Command
	// attached, if set, reads what the mode keeps hooked into the
	// kernel (the eBPF mode's pinned links), which `kpr status` shows
	// whichever mode's state it reads: a hook outlives the tables it
	// reads, and one an earlier mode left still acts.
	attached func(at dataplaneAt) dataplane.Inspection
	// warnings, if set, says what on the node works against the mode,
	// once `kpr status` has found the mode's state (the eBPF mode: the
	// host firewall rules its tc programs bypass); one line each, none
	// when all is well.
	warnings func(at dataplaneAt) []string
}

// kernelReport is the kernel probe's report, the mode table's input: the
// features each mode's probe found (loader probes the eBPF ones).
type kernelReport = loader.Report

// dataplaneAt is where the daemon's state is on the node, for the code
// that reads or removes it apart from the daemon: the pins and records
// under --bpf-root, and the settings of `kpr run` that say where else it
// wrote, as far as the command at hand takes them: --host-netns (the
// network namespace of the netfilter modes' tables and of the tc
// devices), and what a mode's row reads of its own (the eBPF mode's
// --devices and --cgroup-root for `kpr cleanup`; the iptables mode's
// --masquerade-all and --cluster-cidr for `kpr explain`).
type dataplaneAt struct {
	bpfRoot string
	run     runFlags
	// nodeName is the daemon's node, where explain and trace run.
	nodeName string
}

// modeLeftovers is how a mode's state goes once another mode serves, or
// at `kpr cleanup`.
type modeLeftovers struct {
	// remove removes the mode's state from the node: its pins and its
	// records under at.bpfRoot, and what those name in the network
	// namespace at.run.hostNetNS.
	remove func(at dataplaneAt) (leftovers.Removed, error)
	// state names it in the log: "the chains an earlier iptables-mode
	// kpr left".
	state string
	// countField names Removed.Count in the log; empty when the mode
	// does not count.
	countField string
	// removed is `kpr cleanup`'s line for it.
	removed func(count int, at dataplaneAt) string
	// sweep, if set, is `kpr cleanup`'s search, after every mode's
	// remove, for state of the mode that its records no longer name (the
	// eBPF mode's clsact filters on the devices, and programs whose pins
	// were lost); it says what it found on out. The mode switch leaves
	// it out: it removes only what the records name.
	sweep func(at dataplaneAt, out func(line string)) error
}

// modes are the backends of this build, in the order explain and status
// look for their state (the eBPF mode's pins first: a kpr that switched
// to it has them before it removed the other modes' state). Each row is in
// the backend's file.
var modes = []mode{ebpfMode, iptablesMode, ipvsMode, nftablesMode}

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
func removePreviousModeState(firstSync <-chan struct{}, done <-chan struct{}, b backend, at dataplaneAt, log *zap.Logger) {
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
		removed, err := l.remove(at)
		switch {
		case err != nil:
			log.Warn("Could not remove "+l.state, zap.Error(err))
		case removed.Found && l.countField != "":
			log.Info("Removed "+l.state, zap.Int(l.countField, removed.Count))
		case removed.Found:
			log.Info("Removed "+l.state, zap.String("bpfRoot", at.bpfRoot))
		}
	}
}

// removeEveryModeState is `kpr cleanup`'s part for the modes: each mode's
// state goes, and each that had some says so on out.
func removeEveryModeState(out func(line string), at dataplaneAt) error {
	for _, m := range modes {
		removed, err := m.leftovers.remove(at)
		if err != nil {
			return err
		}
		if removed.Found {
			out(m.leftovers.removed(removed.Count, at))
		}
	}
	return nil
}

// sweepEveryMode is the last part of `kpr cleanup`: each mode's search for
// state its records no longer name.
func sweepEveryMode(out func(line string), at dataplaneAt) error {
	for _, m := range modes {
		if m.leftovers.sweep == nil {
			continue
		}
		if err := m.leftovers.sweep(at, out); err != nil {
			return err
		}
	}
	return nil
}

// checkModeFlags checks every mode's flags (mode.checkFlags).
func checkModeFlags(f *runFlags) error {
	for _, m := range modes {
		if m.checkFlags == nil {
			continue
		}
		if err := m.checkFlags(f); err != nil {
			return err
		}
	}
	return nil
}

// probeKernel is what the kernel supports of what the modes need: each
// row's probe, in table order. run is `kpr run`'s flags, nil for the
// operators' commands (see mode.probe), which report every mode.
//
// Under an explicit --mode only that mode's row is probed, as kube-proxy
// checks only the mode it is given: the choice cannot fall on another,
// and the eBPF probe alone (throw-away programs, maps and a cgroup) takes
// 40 to 80 ms of a netfilter mode's start-up for nothing.
func probeKernel(run *runFlags) (kernelReport, error) {
	r := kernelReport{Kernel: loader.KernelRelease()}
	for _, m := range modes {
		if m.probe == nil {
			continue
		}
		if run != nil && run.mode != modeAuto && backend(run.mode) != m.backend {
			continue
		}
		if err := m.probe(&r, run); err != nil {
			return kernelReport{}, err
		}
	}
	return r, nil
}

// probeFeatures is probeKernel for the operators' commands, which prepare
// nothing, so that nothing fails.
func probeFeatures() kernelReport {
	r, _ := probeKernel(nil)
	return r
}

// attachedEverywhere is what every mode keeps hooked into the kernel, for
// `kpr status`.
func attachedEverywhere(at dataplaneAt) []dataplane.Inspection {
	var out []dataplane.Inspection
	for _, m := range modes {
		if m.attached != nil {
			out = append(out, m.attached(at))
		}
	}
	return out
}

// inspectDataplane opens the Inspector of the first mode whose state is on
// the node: `kpr run` removes the other modes' state once it has synced,
// so at most one is found for long.
func inspectDataplane(at dataplaneAt) (backend, dataplane.Inspector, error) {
	var why oneLineErrors
	for _, m := range modes {
		in, err := m.inspect(at)
		if err == nil {
			return m.backend, in, nil
		}
		why = append(why, fmt.Errorf("%s mode: %w", m.backend, err))
	}
	return "", nil, fmt.Errorf("no dataplane of kpr's to read: %w; kpr never ran here, or give the daemon's --bpf-root and --host-netns", why)
}

// oneLineErrors are errors.Join's on one line, "; " between them: the
// callers can still tell each cause (errors.Is), here a permission error
// that asNeedsRoot turns into "run it as root".
type oneLineErrors []error

func (e oneLineErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e oneLineErrors) Unwrap() []error { return e }
