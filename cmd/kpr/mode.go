package main

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/metrics"
)

// backend names one dataplane implementation. The name is what /proxyMode
// answers, as kube-proxy answers "iptables" or "ipvs".
type backend string

// The backends --mode can name. backendEBPF and backendIPTables are built;
// the IPVS fallback will live under iptables-compat/ too.
const (
	backendEBPF     backend = "ebpf"
	backendIPTables backend = "iptables"
	backendIPVS     backend = "ipvs"
)

// modeAuto lets kpr pick the backend from what the kernel supports.
const modeAuto = "auto"

// choice is the backend kpr runs and why, for the log.
type choice struct {
	backend backend
	reason  string
}

// chooseDataplane decides, from --mode and the kernel's features, which
// backend kpr runs. It is the only place that decides, so `kpr run` and
// `kpr probe` cannot disagree; it is pure so that every combination is
// tested without a kernel.
//
// --mode iptables needs none of the eBPF features; whether the iptables
// binaries run is found when the backend is built. --mode auto does not
// fall back to it yet (that is --fallback-mode's job, still to come), but
// its errors name it. No error suggests a mode that this build refuses.
func chooseDataplane(mode string, report loader.Report) (choice, error) {
	switch mode {
	case modeAuto:
		if err := report.RequireSocketLB(); err != nil {
			return choice{}, fmt.Errorf("--mode auto: kpr cannot run the eBPF dataplane, and auto does not fall back yet: %w; "+
				"on this node run kpr with --mode iptables", err)
		}
		return choice{backendEBPF, "the kernel has every feature the eBPF dataplane needs"}, nil
	case string(backendEBPF):
		if err := report.RequireSocketLB(); err != nil {
			return choice{}, fmt.Errorf("--mode ebpf: %w; or run kpr with --mode iptables", err)
		}
		return choice{backendEBPF, "--mode ebpf asked for it, and the kernel has every feature it needs"}, nil
	case string(backendIPTables):
		return choice{backendIPTables, "--mode iptables asked for it; it needs no eBPF feature"}, nil
	case string(backendIPVS):
		return choice{}, errors.New("--mode ipvs: this build of kpr has no IPVS dataplane; " +
			"run kpr with --mode iptables, or --mode auto or ebpf on a kernel with the cgroup socket hooks (`kpr probe` shows them), " +
			"or keep kube-proxy on nodes that need IPVS")
	}
	return choice{}, fmt.Errorf("--mode %q: want auto, ebpf or iptables (ipvs is not built yet)", mode)
}

// builtDataplane is a constructed backend, ready for the watcher.
type builtDataplane struct {
	plane dataplane.Dataplane
	// close drops this process's handles on the backend's state; what the
	// backend programmed keeps serving until the next kpr adopts it.
	close func() error
}

// newDataplane builds the backend c names, as kube-proxy's createProxier
// does for its modes. A new backend adds its constructor here and its
// feature check to chooseDataplane.
func newDataplane(c choice, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	switch c.backend {
	case backendEBPF:
		return newEBPFDataplane(g, f, m, log)
	case backendIPTables:
		return newIPTablesDataplane(log)
	}
	// chooseDataplane only picks backends built above.
	return builtDataplane{}, fmt.Errorf("dataplane %q has no constructor in this build: chooseDataplane and newDataplane disagree; report this as a kpr bug", c.backend)
}

// newIPTablesDataplane programs iptables in kpr's own network namespace
// (the node's, under the DaemonSet's hostNetwork: true).
func newIPTablesDataplane(log *zap.Logger) (builtDataplane, error) {
	log = log.Named("dataplane")
	opts, err := iptables.NodeOptions(iptables.ExecRunner{}, log)
	if err != nil {
		return builtDataplane{}, err
	}
	if err := iptables.EnableLocalhostNodePorts(); err != nil {
		log.Warn("NodePorts on 127.0.0.1 will not be served", zap.Error(err))
	}
	plane, err := iptables.New(opts)
	if err != nil {
		return builtDataplane{}, err
	}
	// The rules stay when kpr exits, as kube-proxy's do; the next kpr's
	// first full sync takes them over.
	return builtDataplane{plane: plane, close: func() error { return nil }}, nil
}
