package main

import (
	"errors"
	"time"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/metrics"
)

// measuredConntrack is the netfilter modes' conntrack cleanup, timed and
// counted per family as kube-proxy's conntrack reconciler is
// (kubeproxy_conntrack_reconciler_sync_duration_seconds and
// _deleted_entries_total).
type measuredConntrack struct {
	inner  netfilter.ConntrackCleaner
	report metrics.ConntrackReporter
}

// withConntrackMetrics wraps c; nil stays nil (no cleanup, nothing to
// measure).
func withConntrackMetrics(c netfilter.ConntrackCleaner, m *metrics.Metrics) netfilter.ConntrackCleaner {
	if c == nil {
		return nil
	}
	return measuredConntrack{inner: c, report: m.Conntrack()}
}

func (c measuredConntrack) DeleteStaleUDP(served netfilter.UDPFrontends) (int, error) {
	byFamily := map[netfilter.Family]netfilter.UDPFrontends{}
	for fe, backends := range served {
		fam := netfilter.FamilyOf(fe.Addr())
		if byFamily[fam] == nil {
			byFamily[fam] = netfilter.UDPFrontends{}
		}
		byFamily[fam][fe] = backends
	}
	total := 0
	var errs []error
	for _, fam := range netfilter.Families {
		if len(byFamily[fam]) == 0 {
			continue
		}
		start := time.Now()
		n, err := c.inner.DeleteStaleUDP(byFamily[fam])
		c.report.ConntrackReconciled(fam.String(), time.Since(start), n)
		total += n
		errs = append(errs, err)
	}
	return total, errors.Join(errs...)
}
