package maps

import (
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/metrics"
)

// fixedTCStats is a TCStatsReader's counters over a fixed struct, without
// the maps behind it.
type fixedTCStats bpf.KprNatStats

func (fixedTCStats) CountConntrack() (map[string]int, error) { return nil, nil }
func (fixedTCStats) ConntrackMaxEntries() map[string]int     { return nil }
func (s fixedTCStats) Counters(emit func(string, uint64)) error {
	emitTCStats(bpf.KprNatStats(s), emit)
	return nil
}

// Every counter the programs keep reaches a kpr_tc_* series, and every
// series the metrics expect is a counter the programs keep: a field added
// to struct nat_stats without a series would go unseen, and a series
// whose field went would fail the scrape.
func TestTCStatsFeedEveryTCSeries(t *testing.T) {
	// Each field its own value, so each can be traced to a series.
	var stats bpf.KprNatStats
	fields := map[uint64]string{}
	v := reflect.ValueOf(&stats).Elem()
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.Uint64 {
			f.SetUint(uint64(1000 + i))
			fields[uint64(1000+i)] = v.Type().Field(i).Name
		}
	}
	if len(fields) == 0 {
		t.Fatal("bpf.KprNatStats has no counters")
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewTCCollector(fixedTCStats(stats)))
	got, err := reg.Gather()
	if err != nil {
		t.Fatalf("scrape: %v (a series names a counter struct nat_stats lacks?)", err)
	}
	exported := map[uint64]bool{}
	for _, mf := range got {
		if !strings.HasPrefix(mf.GetName(), "kpr_tc_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.Counter != nil {
				exported[uint64(m.Counter.GetValue())] = true
			}
		}
	}
	for value, name := range fields {
		if !exported[value] {
			t.Errorf("nat_stats field %s has no kpr_tc_* series in metrics' tcCounters", name)
		}
	}
}
