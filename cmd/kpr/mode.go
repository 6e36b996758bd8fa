package main

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/metrics"
)

// backend names one dataplane implementation. The name is what /proxyMode
// answers, as kube-proxy answers "iptables" or "ipvs".
type backend string

// The backends --mode can name. Only backendEBPF is built today; the
// iptables and IPVS fallbacks will live under iptables-compat/.
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
// When the fallbacks exist, --mode auto turns to them where report lacks
// the socket hooks, and iptables and ipvs get their own feature checks
// here; today those cases say what this build lacks. No error suggests a
// mode that this build refuses.
func chooseDataplane(mode string, report loader.Report) (choice, error) {
	switch mode {
	case modeAuto:
		if err := report.RequireSocketLB(); err != nil {
			return choice{}, fmt.Errorf("--mode auto: kpr cannot run the eBPF dataplane, the only one in this build: %w", err)
		}
		return choice{backendEBPF, "the kernel has every feature the eBPF dataplane needs"}, nil
	case string(backendEBPF):
		if err := report.RequireSocketLB(); err != nil {
			return choice{}, fmt.Errorf("--mode ebpf: %w", err)
		}
		return choice{backendEBPF, "--mode ebpf asked for it, and the kernel has every feature it needs"}, nil
	case string(backendIPTables), string(backendIPVS):
		return choice{}, fmt.Errorf("--mode %s: this build of kpr has only the eBPF dataplane, no %s one; "+
			"run kpr with --mode auto or ebpf on a kernel with the cgroup socket hooks (`kpr probe` shows them), "+
			"or keep kube-proxy on nodes without them", mode, mode)
	}
	return choice{}, fmt.Errorf("--mode %q: want auto or ebpf (iptables and ipvs are not built yet)", mode)
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
	}
	// chooseDataplane only picks backends built above.
	return builtDataplane{}, fmt.Errorf("dataplane %q has no constructor in this build: chooseDataplane and newDataplane disagree; report this as a kpr bug", c.backend)
}
