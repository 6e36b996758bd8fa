package maps

import (
	"reflect"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
)

// TCStatsReader reads the tc programs' kpr_conntrack and kpr_tc_stats maps
// for the metrics at scrape time. It has metrics.TCReader's methods, so
// that the collector reads the maps without depending on this package
// (cmd/kpr hands one to metrics.NewTCCollector). Like ConntrackCounter it
// is not safe for concurrent use; the collector serialises its scrapes.
type TCStatsReader struct {
	counter *ConntrackCounter
	stats   *ebpf.Map
}

// NewTCStatsReader reads conntrack, a kpr_conntrack map, and stats, a
// kpr_tc_stats map.
func NewTCStatsReader(conntrack, stats *ebpf.Map) TCStatsReader {
	return TCStatsReader{counter: NewConntrackCounter(conntrack), stats: stats}
}

// CountConntrack counts the conntrack map's entries, two per flow.
func (r TCStatsReader) CountConntrack() (int, error) { return r.counter.Count() }

// ConntrackMaxEntries is the conntrack map's capacity.
func (r TCStatsReader) ConntrackMaxEntries() int { return r.counter.MaxEntries() }

// Counters hands every counter of struct nat_stats, summed over CPUs, to
// emit by its Go field name.
func (r TCStatsReader) Counters(emit func(name string, value uint64)) error {
	sum, err := TCStats(r.stats)
	if err != nil {
		return err
	}
	emitTCStats(sum, emit)
	return nil
}

// emitTCStats hands each uint64 field of s to emit. Walking the struct
// keeps up with the counters the C side gains: a test checks that the
// metrics have a series for each.
func emitTCStats(s bpf.KprNatStats, emit func(name string, value uint64)) {
	v := reflect.ValueOf(s)
	for i := 0; i < v.NumField(); i++ {
		if f := v.Type().Field(i); f.Type.Kind() == reflect.Uint64 {
			emit(f.Name, v.Field(i).Uint())
		}
	}
}
