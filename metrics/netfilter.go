package metrics

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// IPTablesReporter is what the iptables backend tells the metrics after
// each write. The backend holds it as an option, so that this package
// knows no backend and no backend knows Prometheus.
type IPTablesReporter interface {
	// TableRules is called after a successful write with the rules the
	// backend owns in one table of one family (total), and how many of
	// them that write wrote (written).
	TableRules(family fmt.Stringer, table string, total, written int)
	// RestoreFailed is called for each iptables-restore run that failed.
	RestoreFailed(family fmt.Stringer)
}

// NFTablesReporter is what the nftables backend tells the metrics.
type NFTablesReporter interface {
	// SyncFailed is called for each family of an nft transaction that
	// failed (kpr's one table serves both, so a failure is each one's).
	SyncFailed(family fmt.Stringer)
}

// ConntrackReporter is what a netfilter backend's conntrack cleanup
// tells the metrics: one reconcile of one family's entries, how long it
// took and how many entries it deleted.
type ConntrackReporter interface {
	ConntrackReconciled(family string, took time.Duration, deleted int)
}

// netfilterMetrics are kube-proxy's metrics of its netfilter modes. Each
// is registered on first use, as kube-proxy registers them only in the
// modes that have them.
type netfilterMetrics struct {
	iptablesOnce, nftablesOnce, conntrackOnce sync.Once

	iptablesRulesTotal, iptablesRulesLast *prometheus.GaugeVec
	iptablesRestoreFailures               *prometheus.CounterVec
	nftablesSyncFailures                  *prometheus.CounterVec
	conntrackDuration                     *prometheus.HistogramVec
	conntrackDeleted                      *prometheus.CounterVec
}

// IPTables registers kube-proxy's iptables-mode metrics
// (sync_proxy_rules_iptables_total, _last, _restore_failures_total) and
// returns the reporter the iptables backend feeds them through.
func (m *Metrics) IPTables() IPTablesReporter {
	nf := &m.netfilter
	nf.iptablesOnce.Do(func() {
		nf.iptablesRulesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_iptables_total",
			Help:      "Total number of iptables rules owned by kube-proxy",
		}, []string{"table", ipFamilyLabel})
		nf.iptablesRulesLast = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_iptables_last",
			Help:      "Number of iptables rules written by kube-proxy in last sync",
		}, []string{"table", ipFamilyLabel})
		nf.iptablesRestoreFailures = familyCounter("sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures")
		m.Registry.MustRegister(nf.iptablesRulesTotal, nf.iptablesRulesLast, nf.iptablesRestoreFailures)
	})
	return iptablesReporter{nf}
}

// NFTables registers kube-proxy's nftables-mode failure counter
// (sync_proxy_rules_nftables_sync_failures_total) and returns the
// reporter the nftables backend feeds it through. kube-proxy's nftables
// mode has no rule-count gauges.
func (m *Metrics) NFTables() NFTablesReporter {
	nf := &m.netfilter
	nf.nftablesOnce.Do(func() {
		nf.nftablesSyncFailures = familyCounter("sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures")
		m.Registry.MustRegister(nf.nftablesSyncFailures)
	})
	return nftablesReporter{nf}
}

// Conntrack registers kube-proxy's conntrack reconciler metrics
// (conntrack_reconciler_sync_duration_seconds and
// conntrack_reconciler_deleted_entries_total) and returns their reporter.
func (m *Metrics) Conntrack() ConntrackReporter {
	nf := &m.netfilter
	nf.conntrackOnce.Do(func() {
		nf.conntrackDuration = syncHistogram("conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds")
		nf.conntrackDeleted = familyCounter("conntrack_reconciler_deleted_entries_total", "Cumulative conntrack flows deleted by conntrack reconciler")
		for _, fam := range Families {
			nf.conntrackDuration.WithLabelValues(fam)
			nf.conntrackDeleted.WithLabelValues(fam)
		}
		m.Registry.MustRegister(nf.conntrackDuration, nf.conntrackDeleted)
	})
	return conntrackReporter{nf}
}

func familyCounter(name, help string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem, Name: name, Help: help}, []string{ipFamilyLabel})
	// Zero from the start, so that rate() and increase() alerts see a
	// first failure.
	for _, fam := range Families {
		c.WithLabelValues(fam)
	}
	return c
}

type iptablesReporter struct{ nf *netfilterMetrics }

func (r iptablesReporter) TableRules(family fmt.Stringer, table string, total, written int) {
	r.nf.iptablesRulesTotal.WithLabelValues(table, family.String()).Set(float64(total))
	r.nf.iptablesRulesLast.WithLabelValues(table, family.String()).Set(float64(written))
}

func (r iptablesReporter) RestoreFailed(family fmt.Stringer) {
	r.nf.iptablesRestoreFailures.WithLabelValues(family.String()).Inc()
}

type nftablesReporter struct{ nf *netfilterMetrics }

func (r nftablesReporter) SyncFailed(family fmt.Stringer) {
	r.nf.nftablesSyncFailures.WithLabelValues(family.String()).Inc()
}

type conntrackReporter struct{ nf *netfilterMetrics }

func (r conntrackReporter) ConntrackReconciled(family string, took time.Duration, deleted int) {
	r.nf.conntrackDuration.WithLabelValues(family).Observe(took.Seconds())
	r.nf.conntrackDeleted.WithLabelValues(family).Add(float64(deleted))
}
