package maps

import (
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
)

// TCStatsReader reads the tc programs' conntrack maps and kpr_tc_stats
// for the metrics at scrape time. It has metrics.TCReader's methods, so
// that the collector reads the maps without depending on this package
// (cmd/kpr hands one to metrics.NewTCCollector). Like ConntrackCounter it
// is not safe for concurrent use; the collector serialises its scrapes.
type TCStatsReader struct {
	counters map[string]*ConntrackCounter
	stats    *ebpf.Map
}

// NewTCStatsReader reads m's conntrack maps (kpr_conntrack and kpr_ct_new)
// and its kpr_tc_stats.
func NewTCStatsReader(m *bpf.KprMaps) TCStatsReader {
	return TCStatsReader{counters: map[string]*ConntrackCounter{
		bpf.KprMapKprConntrack: NewConntrackCounter(m.KprConntrack),
		bpf.KprMapKprCtNew:     NewConntrackCounter(m.KprCtNew),
	}, stats: m.KprTcStats}
}

// CountConntrack counts each conntrack map's entries, two per flow.
func (r TCStatsReader) CountConntrack() (map[string]int, error) {
	out := make(map[string]int, len(r.counters))
	for name, c := range r.counters {
		n, err := c.Count()
		if err != nil {
			return nil, fmt.Errorf("count the entries of %s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

// ConntrackMaxEntries is each conntrack map's capacity.
func (r TCStatsReader) ConntrackMaxEntries() map[string]int {
	out := make(map[string]int, len(r.counters))
	for name, c := range r.counters {
		out[name] = c.MaxEntries()
	}
	return out
}

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
