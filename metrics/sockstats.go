package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// SockCounts reads the socket hooks' datapath counters at scrape time: it
// calls emit once per hook with the totals since the counters' map was
// created. The eBPF backend supplies it (the counters live in a BPF map,
// which this package does not read itself, so that it stays
// backend-neutral).
type SockCounts func(emit func(hook string, translated, rejected, passed uint64)) error

// sockStatsCollector exports SockCounts as counters labelled by hook.
type sockStatsCollector struct {
	read                          SockCounts
	translations, rejects, passes *prometheus.Desc
}

// NewSockStatsCollector returns a collector for the socket hooks'
// counters, to register beside Metrics' own:
//
//	kpr_sock_translations_total{hook}  connect/sendmsg: frontend to backend;
//	                                   recvmsg/getpeername: backend back to frontend
//	kpr_sock_rejects_total{hook}       frontends without endpoints (the syscall fails)
//	kpr_sock_passes_total{hook}        addresses left alone (no Service, no reverse entry)
func NewSockStatsCollector(read SockCounts) prometheus.Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(kprNamespace, "sock", name), help, []string{"hook"}, nil)
	}
	return &sockStatsCollector{
		read:         read,
		translations: desc("translations_total", "Addresses the socket hook translated: frontend to backend (connect, sendmsg) or backend back to frontend (recvmsg, getpeername)"),
		rejects:      desc("rejects_total", "Syscalls the socket hook failed because the Service frontend has no endpoints"),
		passes:       desc("passes_total", "Addresses the socket hook left alone: no Service frontend, or no reverse translation for the socket"),
	}
}

func (c *sockStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.translations
	ch <- c.rejects
	ch <- c.passes
}

func (c *sockStatsCollector) Collect(ch chan<- prometheus.Metric) {
	err := c.read(func(hook string, translated, rejected, passed uint64) {
		ch <- prometheus.MustNewConstMetric(c.translations, prometheus.CounterValue, float64(translated), hook)
		ch <- prometheus.MustNewConstMetric(c.rejects, prometheus.CounterValue, float64(rejected), hook)
		ch <- prometheus.MustNewConstMetric(c.passes, prometheus.CounterValue, float64(passed), hook)
	})
	if err != nil {
		// The scrape fails visibly rather than showing stale or zero counts.
		ch <- prometheus.NewInvalidMetric(c.translations, err)
	}
}
