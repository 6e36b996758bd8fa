package main

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/metrics"
)

// countingCleaner deletes two entries per frontend it is given.
type countingCleaner struct {
	calls []netfilter.UDPFrontends
	err   error
}

func (c *countingCleaner) DeleteStaleUDP(served netfilter.UDPFrontends) (int, error) {
	c.calls = append(c.calls, served)
	return 2 * len(served), c.err
}

// udpFrontends serves each frontend by one backend.
func udpFrontends(pairs ...string) netfilter.UDPFrontends {
	out := netfilter.UDPFrontends{}
	for i := 0; i < len(pairs); i += 2 {
		out[netip.MustParseAddrPort(pairs[i])] = map[netip.AddrPort]bool{netip.MustParseAddrPort(pairs[i+1]): true}
	}
	return out
}

// The cleanup of a sync that serves UDP frontends of both families is one
// reconcile per family, each counted in its ip_family, as kube-proxy's
// per-family conntrack reconciler counts them; the inner cleaner's error
// still comes back.
func TestConntrackCleanupIsMeasuredPerFamily(t *testing.T) {
	m := metrics.New()
	inner := &countingCleaner{}
	c := withConntrackMetrics(inner, m)
	n, err := c.DeleteStaleUDP(udpFrontends(
		"10.96.0.10:53", "10.244.0.1:53",
		"10.96.0.11:53", "10.244.0.2:53",
		"[fd00:96::10]:53", "[fd00:10:244::1]:53",
	))
	if err != nil || n != 6 {
		t.Fatalf("DeleteStaleUDP = %d, %v; want 6 entries, no error", n, err)
	}
	if len(inner.calls) != 2 || len(inner.calls[0]) != 2 || len(inner.calls[1]) != 1 {
		t.Fatalf("inner calls %v, want the two IPv4 frontends, then the IPv6 one", inner.calls)
	}
	got := map[string]float64{}
	counts := map[string]uint64{}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			fam := labelOf(s, "ip_family")
			switch f.GetName() {
			case "kubeproxy_conntrack_reconciler_deleted_entries_total":
				got[fam] = s.GetCounter().GetValue()
			case "kubeproxy_conntrack_reconciler_sync_duration_seconds":
				counts[fam] = s.GetHistogram().GetSampleCount()
			}
		}
	}
	if got["IPv4"] != 4 || got["IPv6"] != 2 {
		t.Errorf("deleted entries %v, want IPv4 4, IPv6 2", got)
	}
	if counts["IPv4"] != 1 || counts["IPv6"] != 1 {
		t.Errorf("reconciles %v, want one per family", counts)
	}

	inner.err = errors.New("netlink: permission denied")
	if _, err := c.DeleteStaleUDP(udpFrontends("10.96.0.10:53", "10.244.0.3:53")); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("DeleteStaleUDP error %v, want the inner cleaner's", err)
	}
	if withConntrackMetrics(nil, m) != nil {
		t.Error("no cleaner became one")
	}
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
