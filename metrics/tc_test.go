package metrics

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpr-io/kpr/bpf"
)

type fakeTC struct {
	entries, counts int
	countErr        error
	stats_          bpf.KprNatStats
}

func (f *fakeTC) countConntrack() (int, error) { f.counts++; return f.entries, f.countErr }
func (f *fakeTC) conntrackMaxEntries() int     { return 131072 }
func (f *fakeTC) stats() (bpf.KprNatStats, error) {
	return f.stats_, nil
}

// Every counter the programs keep has a series: a field added to struct
// nat_stats without one would go unseen.
func TestTCCountersCoverNatStats(t *testing.T) {
	mapped := map[string]bool{}
	for _, c := range tcCounters {
		mapped[c.field] = true
	}
	typ := reflect.TypeOf(bpf.KprNatStats{})
	for i := 0; i < typ.NumField(); i++ {
		if f := typ.Field(i); f.Type.Kind() == reflect.Uint64 && !mapped[f.Name] {
			t.Errorf("nat_stats field %s has no kpr_tc_* series in tcCounters", f.Name)
		}
	}
	for f := range mapped {
		if _, ok := typ.FieldByName(f); !ok {
			t.Errorf("tcCounters names %s, which bpf.KprNatStats lacks", f)
		}
	}
}

func TestTCCollectorExportsCountersAndCachesTheCount(t *testing.T) {
	fake := &fakeTC{entries: 6, stats_: bpf.KprNatStats{Translated: 10, Reversed: 9, DropNoBackend: 3, DropCtInsert: 2}}
	now := time.Unix(1000, 0)
	c := newTCCollector(fake, func() time.Time { return now })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for name, v := range map[string]float64{
		"kpr_tc_conntrack_entries":               6,
		"kpr_tc_conntrack_max_entries":           131072,
		"kpr_tc_translations_total/forward":      10,
		"kpr_tc_translations_total/reply":        9,
		"kpr_tc_drops_total/no_backend":          3,
		"kpr_tc_drops_total/conntrack_insert":    2,
		"kpr_tc_conntrack_insert_failures_total": 2,
		"kpr_tc_drops_total/snat_ports":          0,
		"kpr_tc_passed_total/cluster_ip_outside": 0,
		"kpr_tc_redirected_packets_total":        0,
		"kpr_tc_map_read_errors_total":           0,
	} {
		if got, ok := gatherValues(t, reg)[name]; !ok || got != v {
			t.Errorf("%s = %v (exported: %v), want %v", name, got, ok, v)
		}
	}
	counts := fake.counts

	// Within the interval the count is not taken again: scrapes stay cheap.
	fake.entries = 8
	now = now.Add(ConntrackCountInterval / 2)
	if n := gatherValues(t, reg)["kpr_tc_conntrack_entries"]; n != 6 || fake.counts != counts {
		t.Errorf("within the interval: entries %v after %d counts, want the cached 6 after %d", n, fake.counts, counts)
	}
	now = now.Add(ConntrackCountInterval)
	if n := gatherValues(t, reg)["kpr_tc_conntrack_entries"]; n != 8 {
		t.Errorf("after the interval: entries %v, want a fresh 8", n)
	}

	// A failed count leaves the series out and is counted.
	fake.countErr = errors.New("boom")
	now = now.Add(ConntrackCountInterval)
	got := gatherValues(t, reg)
	if _, ok := got["kpr_tc_conntrack_entries"]; ok || got["kpr_tc_map_read_errors_total"] != 1 {
		t.Errorf("after a failed count: entries exported %v, read errors %v; want left out, 1", ok, got["kpr_tc_map_read_errors_total"])
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
