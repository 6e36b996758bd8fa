package iptables

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// recordingMetrics keeps the last rule counts reported per family and
// table, and the restore failures.
type recordingMetrics struct {
	total, written map[string]int
	failures       map[string]int
}

func newRecordingMetrics() *recordingMetrics {
	return &recordingMetrics{total: map[string]int{}, written: map[string]int{}, failures: map[string]int{}}
}

func (r *recordingMetrics) TableRules(family fmt.Stringer, table string, total, written int) {
	r.total[family.String()+" "+table] = total
	r.written[family.String()+" "+table] = written
}

func (r *recordingMetrics) RestoreFailed(family fmt.Stringer) { r.failures[family.String()]++ }

// kprRules counts the rules iptables-save shows in the chains other than
// the built-in ones (whose rules are the base jumps, not counted), which
// are all kpr's in the fake.
func kprRules(t *testing.T, tp testPlane, fam netfilter.Family, table string) int {
	t.Helper()
	out, err := tp.fake.Run(netfilter.ToolsFor(netfilter.NFT, fam).Save, []string{"-t", table}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		chain, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		chain, _, _ = strings.Cut(chain, " ")
		switch chain {
		case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		default:
			n++
		}
	}
	return n
}

// The rule counts are those of the tables after each write, per family
// and table (kube-proxy's sync_proxy_rules_iptables_total), whether the
// write was partial or full; _last is what the write itself wrote.
func TestRuleCountsFollowTheTables(t *testing.T) {
	tp := newTestPlane(t)
	rec := newRecordingMetrics()
	tp.metrics = rec
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.10:80", dataplane.TCP, bes("10.244.0.1:80", "10.244.0.2:80"), nil),
		front(dataplane.NodePort, "0.0.0.0:30080", dataplane.TCP, bes("10.244.0.1:80", "10.244.0.2:80"), nil)}}
	empty := &dataplane.ServicePort{Name: spn("shop", "empty", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.11:80", dataplane.TCP, nil, nil)}}
	check := func(when string) {
		t.Helper()
		for _, fam := range netfilter.Families {
			for _, table := range tables {
				key := fam.String() + " " + table
				if got, want := rec.total[key], kprRules(t, tp, fam, table); got != want {
					t.Errorf("%s: %s rules reported %d, iptables-save shows %d", when, key, got, want)
				}
			}
		}
	}
	if err := tp.Reconcile(changes(web, empty)); err != nil {
		t.Fatal(err)
	}
	check("after the full sync")
	if rec.total["IPv4 nat"] == 0 || rec.total["IPv4 filter"] == 0 {
		t.Fatalf("no rules counted: %v", rec.total)
	}
	if rec.written["IPv4 nat"] != rec.total["IPv4 nat"] {
		t.Errorf("a full sync wrote %d IPv4 nat rules, want all %d", rec.written["IPv4 nat"], rec.total["IPv4 nat"])
	}

	// One endpoint more: a partial sync writes the Service's chains only.
	web2 := *web
	web2.Frontends = []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.10:80", dataplane.TCP, bes("10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"), nil),
		front(dataplane.NodePort, "0.0.0.0:30080", dataplane.TCP, bes("10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"), nil)}
	before := rec.total["IPv4 nat"]
	if err := tp.Apply(changes(&web2)); err != nil {
		t.Fatal(err)
	}
	check("after the partial sync")
	if rec.total["IPv4 nat"] <= before {
		t.Errorf("a third endpoint left the IPv4 nat count at %d (was %d)", rec.total["IPv4 nat"], before)
	}
	if w := rec.written["IPv4 nat"]; w == 0 || w >= rec.total["IPv4 nat"] {
		t.Errorf("the partial sync wrote %d IPv4 nat rules, want some but not all %d", w, rec.total["IPv4 nat"])
	}
	if rec.written["IPv6 nat"] != 0 {
		t.Errorf("an IPv4-only change wrote %d IPv6 nat rules", rec.written["IPv6 nat"])
	}
}

// Every failed iptables-restore is counted in its family, the undo's
// included, as kube-proxy counts sync_proxy_rules_iptables_restore_failures_total.
func TestRestoreFailuresAreCounted(t *testing.T) {
	tp := newTestPlane(t)
	rec := newRecordingMetrics()
	tp.metrics = rec
	if err := tp.Apply(changes(dualStack(bes("10.244.0.1:80"), bes("[fd00:10:244::1]:80")))); err != nil {
		t.Fatal(err)
	}
	if len(rec.failures) != 0 {
		t.Fatalf("failures %v before any failed", rec.failures)
	}
	injected := errors.New("injected")
	tp.failing.failAt(2, injected) // the IPv6 nat table
	err := tp.Apply(changes(dualStack(bes("10.244.0.2:80"), bes("[fd00:10:244::2]:80"))))
	tp.failing.failAt(0, nil)
	if !errors.Is(err, injected) {
		t.Fatalf("Apply = %v, want the injected failure", err)
	}
	if rec.failures["IPv6"] != 1 || rec.failures["IPv4"] != 0 {
		t.Errorf("failures %v, want one in IPv6", rec.failures)
	}
}
