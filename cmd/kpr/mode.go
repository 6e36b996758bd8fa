package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/metrics"
)

// backend names one dataplane implementation. The name is what /proxyMode
// answers, as kube-proxy answers "iptables" or "ipvs".
type backend string

// The backends --mode can name; the fallbacks live under iptables-compat/.
const (
	backendEBPF     backend = "ebpf"
	backendIPTables backend = "iptables"
	backendIPVS     backend = "ipvs"
	backendNFTables backend = "nftables"
)

// modeAuto lets kpr pick the backend from what the kernel supports.
const modeAuto = "auto"

// defaultFallback is --fallback-mode's default: where eBPF cannot run,
// --mode auto runs nftables where the kernel runs it (kube-proxy's
// nftables mode asks for 5.13), else iptables (lastFallback), which needs
// nothing of the kernel the probe knows.
const defaultFallback = modeAuto

// lastFallback is what every node can run: --mode auto's last choice, and
// what an error that refuses a --fallback-mode tells to run instead.
const lastFallback = string(backendIPTables)

// Why a backend was chosen: the reason label of kpr_proxy_mode. They are
// few and fixed, so that the label stays a label; the log line has the
// whole story (which features are missing).
const (
	// causeRequested: --mode named the backend.
	causeRequested = "requested"
	// causeEBPFSupported: --mode auto, and the kernel runs the eBPF
	// dataplane.
	causeEBPFSupported = "ebpf-supported"
	// causeEBPFUnavailable: --mode auto fell back to --fallback-mode,
	// because the kernel lacks a feature or refused the probe.
	causeEBPFUnavailable = "ebpf-unavailable"
)

// choice is the backend kpr runs and why.
type choice struct {
	backend backend
	// cause is one of the cause* constants.
	cause string
	// reason is the sentence for the log and `kpr probe`.
	reason string
}

// chooseDataplane decides, from --mode, --fallback-mode and the kernel's
// features, which backend kpr runs. It is the only place that decides, so
// `kpr run` and `kpr probe` cannot disagree; it is pure so that every
// combination is tested without a kernel.
//
// --mode iptables needs none of the eBPF features; whether the iptables
// binaries run is found when the backend is built. --mode auto runs eBPF
// where the kernel can, and the fallback where it cannot, whatever the
// reason (an old kernel, or a policy that forbids loading BPF): the
// reason names the missing features. An explicit --mode ebpf never falls
// back. --mode ipvs, and auto with --fallback-mode ipvs where it falls
// back, need IPVS in the kernel: a node where the mode picked cannot
// serve Services refuses to start.
func chooseDataplane(mode, fallback string, report kernelReport) (choice, error) {
	fb, err := fallbackMode(fallback)
	if err != nil {
		return choice{}, err
	}
	if mode == modeAuto {
		ebpf := modeOf(backendEBPF)
		if err := ebpf.require(report); err != nil {
			if fb == nil {
				return autoFallback(report, err), nil
			}
			if fb.require != nil {
				if fbErr := fb.require(report); fbErr != nil {
					return choice{}, fmt.Errorf("--mode auto: the eBPF dataplane cannot run here (%v), and neither can --fallback-mode %s: %w; "+
						"run kpr with --fallback-mode %s", err, fb.backend, fbErr, lastFallback)
				}
			}
			return choice{fb.backend, causeEBPFUnavailable, fmt.Sprintf("the eBPF dataplane cannot run here, so --mode auto runs --fallback-mode %s: %v", fb.backend, err)}, nil
		}
		return choice{backendEBPF, causeEBPFSupported, "the kernel has every feature the eBPF dataplane needs"}, nil
	}
	m := modeOf(backend(mode))
	if m == nil {
		return choice{}, fmt.Errorf("--mode %q: want %s", mode, modeNames(false, modeAuto))
	}
	if m.require != nil {
		if err := m.require(report); err != nil {
			return choice{}, fmt.Errorf("--mode %s: %w; %s", mode, err, m.refused)
		}
	}
	return choice{m.backend, causeRequested, m.requested}, nil
}

// fallbackMode checks --fallback-mode. It is checked whatever --mode is,
// so that a value that cannot work fails on every node alike, not only on
// the nodes that happen to need it.
//
// The default, auto, is no one mode: it returns nil, and autoFallback
// decides on the node.
func fallbackMode(fallback string) (*mode, error) {
	if fallback == modeAuto {
		return nil, nil
	}
	if m := modeOf(backend(fallback)); m != nil && m.fallback {
		return m, nil
	}
	return nil, fmt.Errorf("--fallback-mode %q: want %s", fallback, modeNames(true, modeAuto))
}

// autoFallback is --mode auto's choice where eBPF cannot run (ebpfErr
// says why) and --fallback-mode is auto: nftables where the kernel runs
// it, as upstream kube-proxy moves to it, else iptables.
func autoFallback(report kernelReport, ebpfErr error) choice {
	nft := modeOf(backendNFTables)
	if nft != nil {
		nftErr := nft.require(report)
		if nftErr == nil {
			return choice{backendNFTables, causeEBPFUnavailable, fmt.Sprintf(
				"the eBPF dataplane cannot run here, so --mode auto runs nftables, which the kernel supports: %v", ebpfErr)}
		}
		return choice{backend(lastFallback), causeEBPFUnavailable, fmt.Sprintf(
			"the eBPF dataplane cannot run here (%v), nor the nftables one (%v), so --mode auto runs %s", ebpfErr, nftErr, lastFallback)}
	}
	return choice{backend(lastFallback), causeEBPFUnavailable, fmt.Sprintf("the eBPF dataplane cannot run here, so --mode auto runs %s: %v", lastFallback, ebpfErr)}
}

// builtDataplane is a constructed backend, ready for the watcher.
type builtDataplane struct {
	plane dataplane.Dataplane
	// close drops this process's handles on the backend's state; what the
	// backend programmed keeps serving until the next kpr adopts it.
	close func() error
	// setDevices moves the tc programs to these devices; nil for a
	// backend without them.
	setDevices func(devices []string) error
	// watchPods follows the node's Pods until ctx ends, for the socket
	// hooks' per-pod choice; nil when the backend has no use for Pods.
	watchPods func(ctx context.Context, client *apiclient.Clients, nodeName string) error
	// socketLB reports the socket hooks' --socket-lb and bypassed pods,
	// for kpr status; nil for a backend without socket hooks.
	socketLB func() *socketLBStatus
}

// newDataplane builds the backend c names through its row in the mode
// table, as kube-proxy's createProxier does for its modes.
// ctx ends the dataplane's commands (iptables-restore and the like), so
// that kpr run exits on SIGTERM without waiting for a long one.
func newDataplane(ctx context.Context, c choice, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	if mode := modeOf(c.backend); mode != nil {
		return mode.build(ctx, g, f, m, log)
	}
	// chooseDataplane only picks backends of the mode table.
	return builtDataplane{}, fmt.Errorf("dataplane %q has no row in the mode table of this build: chooseDataplane and newDataplane disagree; report this as a kpr bug", c.backend)
}

// logChoice logs the decision. A fallback is a warning: the node runs, but
// not the dataplane the operator most likely meant, and the line names
// what the kernel lacks.
func logChoice(log *zap.Logger, mode string, c choice) {
	fields := []zap.Field{zap.String("mode", mode), zap.String("backend", string(c.backend)),
		zap.String("cause", c.cause), zap.String("reason", c.reason)}
	if c.cause == causeEBPFUnavailable {
		log.Warn("dataplane selected", fields...)
		return
	}
	log.Info("dataplane selected", fields...)
}

// exportChoice sets kpr_proxy_mode for the chosen backend.
func exportChoice(m *metrics.Metrics, c choice) {
	m.ProxyMode.WithLabelValues(string(c.backend), c.cause).Set(1)
}
