package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeTC reports every counter tcCounters names, from counters where set
// and 0 otherwise, and the names in missing not at all.
type fakeTC struct {
	entries, counts int // entries of kpr_conntrack; kpr_ct_new has one more
	countErr        error
	counters        map[string]uint64
	missing         map[string]bool
}

func (f *fakeTC) CountConntrack() (map[string]int, error) {
	f.counts++
	return map[string]int{"kpr_conntrack": f.entries, "kpr_ct_new": f.entries + 1}, f.countErr
}
func (f *fakeTC) ConntrackMaxEntries() map[string]int {
	return map[string]int{"kpr_conntrack": 131072, "kpr_ct_new": 65536}
}
func (f *fakeTC) Counters(emit func(string, uint64)) error {
	for _, c := range tcCounters {
		if !f.missing[c.field] {
			emit(c.field, f.counters[c.field])
		}
	}
	return nil
}

func TestTCCollectorExportsCountersAndCachesTheCount(t *testing.T) {
	fake := &fakeTC{entries: 6, counters: map[string]uint64{"Translated": 10, "Reversed": 9, "DropNoBackend": 3, "DropCtInsert": 2, "IcmpTooBig": 4}}
	now := time.Unix(1000, 0)
	c := newTCCollector(fake, func() time.Time { return now })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for name, v := range map[string]float64{
		"kpr_tc_conntrack_entries/kpr_conntrack":     6,
		"kpr_tc_conntrack_entries/kpr_ct_new":        7,
		"kpr_tc_conntrack_max_entries/kpr_conntrack": 131072,
		"kpr_tc_conntrack_max_entries/kpr_ct_new":    65536,
		"kpr_tc_translations_total/forward":          10,
		"kpr_tc_translations_total/reply":            9,
		"kpr_tc_drops_total/no_backend":              3,
		"kpr_tc_drops_total/conntrack_insert":        2,
		"kpr_tc_conntrack_insert_failures_total":     2,
		"kpr_tc_drops_total/snat_ports":              0,
		"kpr_tc_passed_total/cluster_ip_outside":     0,
		"kpr_tc_redirected_packets_total":            0,
		"kpr_tc_icmp_errors_sent_total/too_big":      4,
		"kpr_tc_map_read_errors_total":               0,
	} {
		if got, ok := gatherValues(t, reg)[name]; !ok || got != v {
			t.Errorf("%s = %v (exported: %v), want %v", name, got, ok, v)
		}
	}
	counts := fake.counts

	// Within the interval the count is not taken again: scrapes stay cheap.
	fake.entries = 8
	now = now.Add(ConntrackCountInterval / 2)
	if n := gatherValues(t, reg)["kpr_tc_conntrack_entries/kpr_conntrack"]; n != 6 || fake.counts != counts {
		t.Errorf("within the interval: entries %v after %d counts, want the cached 6 after %d", n, fake.counts, counts)
	}
	now = now.Add(ConntrackCountInterval)
	if n := gatherValues(t, reg)["kpr_tc_conntrack_entries/kpr_conntrack"]; n != 8 {
		t.Errorf("after the interval: entries %v, want a fresh 8", n)
	}

	// A failed count leaves the series out and is counted.
	fake.countErr = errors.New("boom")
	now = now.Add(ConntrackCountInterval)
	got := gatherValues(t, reg)
	if _, ok := got["kpr_tc_conntrack_entries/kpr_conntrack"]; ok || got["kpr_tc_map_read_errors_total"] != 1 {
		t.Errorf("after a failed count: entries exported %v, read errors %v; want left out, 1", ok, got["kpr_tc_map_read_errors_total"])
	}
}

// A counter the backend does not report fails the scrape: showing it as 0
// would hide that the backend and tcCounters disagree.
func TestTCCollectorFailsOnAMissingCounter(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newTCCollector(&fakeTC{missing: map[string]bool{"Snat": true}}, time.Now))
	if _, err := reg.Gather(); err == nil {
		t.Error("scrape without the Snat counter succeeded; want an error naming it")
	}
}

// gatherValues is every series of reg, named name/label-value.
func gatherValues(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range got {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			switch {
			case m.Counter != nil:
				values[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				values[name] = m.Gauge.GetValue()
			}
		}
	}
	return values
}
