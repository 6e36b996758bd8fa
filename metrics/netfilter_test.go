package metrics

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

type family string

func (f family) String() string { return string(f) }

// kube-proxy registers its netfilter metrics only in the modes that have
// them; so does kpr: an eBPF-mode scrape has none of them, a mode's
// scrape has its own, and a reporter's calls show under kube-proxy's
// names and labels.
func TestNetfilterMetricsAreTheModes(t *testing.T) {
	names := []string{
		"kubeproxy_sync_proxy_rules_iptables_total",
		"kubeproxy_sync_proxy_rules_iptables_last",
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
		"kubeproxy_conntrack_reconciler_sync_duration_seconds",
		"kubeproxy_conntrack_reconciler_deleted_entries_total",
	}
	_, body := get(t, New().Handler("ebpf"), "/metrics")
	for _, n := range names {
		if strings.Contains(body, n) {
			t.Errorf("an eBPF-mode scrape has %s", n)
		}
	}

	m := New()
	ipt := m.IPTables()
	ipt.TableRules(family(IPv4), "nat", 120, 17)
	ipt.TableRules(family(IPv6), "filter", 4, 4)
	ipt.RestoreFailed(family(IPv6))
	if again := m.IPTables(); again == nil {
		t.Fatal("a second IPTables() returned nil")
	}
	ct := m.Conntrack()
	ct.ConntrackReconciled(IPv4, 3*time.Millisecond, 2)
	code, body := get(t, m.Handler("iptables"), "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics answered %d", code)
	}
	for _, series := range []string{
		`kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"} 120`,
		`kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="nat"} 17`,
		`kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="filter"} 4`,
		`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv6"} 1`,
		`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 0`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv6"} 0`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 2`,
	} {
		if !strings.Contains(body, series+"\n") {
			t.Errorf("iptables-mode scrape lacks %q", series)
		}
	}
	if strings.Contains(body, "nftables") {
		t.Error("an iptables-mode scrape has nftables metrics")
	}

	n := New()
	n.NFTables().SyncFailed(family(IPv4))
	_, body = get(t, n.Handler("nftables"), "/metrics")
	if !strings.Contains(body, `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 1`+"\n") {
		t.Error("nftables-mode scrape lacks the failure")
	}
	if strings.Contains(body, "iptables_total") {
		t.Error("an nftables-mode scrape has iptables rule counts")
	}
}

// Every sync is one observation in each family, in the histogram of its
// kind; the timestamps are each family's too.
func TestObserveSyncByKind(t *testing.T) {
	m := New()
	m.ObserveSync(false, 2*time.Millisecond)
	m.ObserveSync(false, 2*time.Millisecond)
	m.ObserveSync(true, 300*time.Millisecond)
	m.SetLastSync(time.Unix(1700000000, 0))
	_, body := get(t, m.Handler("ebpf"), "/metrics")
	for _, fam := range Families {
		for _, series := range []string{
			`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="` + fam + `"} 3`,
			`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="` + fam + `"} 2`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="` + fam + `"} 1`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="` + fam + `",le="0.256"} 0`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="` + fam + `",le="0.512"} 1`,
			`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="` + fam + `"} 1.7e+09`,
		} {
			if !strings.Contains(body, series+"\n") {
				t.Errorf("scrape lacks %q", series)
			}
		}
	}
}
