package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// SockHookCounts are one socket hook's totals since the counters' map was
// created.
type SockHookCounts struct {
	Hook                                   string
	Translated, Rejected, Passed, Bypassed uint64
}

// SockCounts reads the socket hooks' datapath counters at scrape time: it
// calls emit once per hook. The eBPF backend supplies it (the counters live
// in a BPF map, which this package does not read itself, so that it stays
// backend-neutral).
type SockCounts func(emit func(SockHookCounts)) error

// sockStatsCollector exports SockCounts as counters labelled by hook.
type sockStatsCollector struct {
	read                                    SockCounts
	translations, rejects, passes, bypasses *prometheus.Desc
}

// NewSockStatsCollector returns a collector for the socket hooks'
// counters, to register beside Metrics' own:
//
//	kpr_sock_translations_total{hook}  connect/sendmsg: frontend to backend;
//	                                   recvmsg/getpeername: backend back to frontend
//	kpr_sock_rejects_total{hook}       frontends without endpoints (the syscall fails)
//	kpr_sock_passes_total{hook}        addresses left alone (no Service, no reverse entry)
//	kpr_sock_bypasses_total{hook}      frontends left to the packet path: the socket's
//	                                   pod is not served by the socket hooks (--socket-lb)
func NewSockStatsCollector(read SockCounts) prometheus.Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(kprNamespace, "sock", name), help, []string{"hook"}, nil)
	}
	return &sockStatsCollector{
		read:         read,
		translations: desc("translations_total", "Addresses the socket hook translated: frontend to backend (connect, sendmsg) or backend back to frontend (recvmsg, getpeername)"),
		rejects:      desc("rejects_total", "Syscalls the socket hook failed because the Service frontend has no endpoints"),
		passes:       desc("passes_total", "Addresses the socket hook left alone: no Service frontend, or no reverse translation for the socket"),
		bypasses: desc("bypasses_total", "Service frontends the socket hook left to the packet path, because the socket's pod is not served "+
			"by the socket hooks (kpr run --socket-lb)"),
	}
}

func (c *sockStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.translations
	ch <- c.rejects
	ch <- c.passes
	ch <- c.bypasses
}

func (c *sockStatsCollector) Collect(ch chan<- prometheus.Metric) {
	err := c.read(func(h SockHookCounts) {
		ch <- prometheus.MustNewConstMetric(c.translations, prometheus.CounterValue, float64(h.Translated), h.Hook)
		ch <- prometheus.MustNewConstMetric(c.rejects, prometheus.CounterValue, float64(h.Rejected), h.Hook)
		ch <- prometheus.MustNewConstMetric(c.passes, prometheus.CounterValue, float64(h.Passed), h.Hook)
		ch <- prometheus.MustNewConstMetric(c.bypasses, prometheus.CounterValue, float64(h.Bypassed), h.Hook)
	})
	if err != nil {
		// The scrape fails visibly rather than showing stale or zero counts.
		ch <- prometheus.NewInvalidMetric(c.translations, err)
	}
}
