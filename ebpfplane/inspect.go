package ebpfplane

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
)

// Reading the pinned maps back for `kpr explain` and `kpr status`, which
// run apart from the daemon: what the maps hold for a ServicePort,
// compared entry by entry with what the Plane writes for it (expand), so
// the reader holds no second notion of what the maps should hold.

// Inspector is the eBPF mode's dataplane.Inspector over the pinned maps.
type Inspector struct {
	lb        *maps.LB
	sockStats metrics.SockCounts
	close     func()
}

var _ dataplane.Inspector = (*Inspector)(nil)

// OpenInspector opens the maps pinned under bpfRoot read-only; the error
// says why there are none. Close releases them.
func OpenInspector(bpfRoot string) (*Inspector, error) {
	pinned, err := loader.OpenPinnedMaps(bpfRoot)
	if err != nil {
		return nil, err
	}
	lb, err := maps.OpenReadOnly(pinned)
	if err != nil {
		pinned.Close()
		return nil, err
	}
	return &Inspector{lb: lb, sockStats: SockCounts(pinned.KprSockStats), close: func() { pinned.Close() }}, nil
}

// Close releases the maps.
func (in *Inspector) Close() { in.close() }

// MapEntry is one frontend and scope: what kpr wants in the maps and
// what is there.
type MapEntry struct {
	Frontend string   `json:"frontend"`
	Scope    string   `json:"scope"`
	Want     []string `json:"want"`
	Have     []string `json:"have"`
	Present  bool     `json:"present"`
	Matches  bool     `json:"matches"`
}

// Columns says whether the entry matches.
func (m MapEntry) Columns() []string {
	state := "matches"
	switch {
	case !m.Present:
		state = "MISSING"
	case !m.Matches:
		state = "DIFFERS: holds " + dataplane.DescribeBackends(m.Have)
	}
	return []string{fmt.Sprintf("%s %s: %s", m.Frontend, m.Scope, state)}
}

// InspectPorts is what the maps hold for ports, entry by entry as the
// Plane writes them, and every divergence.
func (in *Inspector) InspectPorts(ports []dataplane.ServicePort) (dataplane.Inspection, error) {
	out := dataplane.Inspection{Key: "maps", Title: "maps", Rows: []dataplane.InspectedRow{}, Divergences: []string{},
		Agrees: "the maps hold exactly what kpr wants for this Service"}
	for i := range ports {
		for _, want := range expand(&ports[i]) {
			c := MapEntry{Frontend: want.VIP.String(), Scope: want.Scope.String(), Want: dataplane.BackendStrings(want.Backends), Have: []string{}}
			have, ok := in.lb.Get(want.VIPKey)
			c.Present = ok
			c.Matches = in.lb.Matches(want)
			if ok {
				c.Have = dataplane.BackendStrings(have.Backends)
			}
			switch {
			case !ok:
				out.Divergences = append(out.Divergences, fmt.Sprintf("%s %s scope: missing from the service map (deleted by hand, refused as map full, or not synced yet); "+
					"connections to it are not translated. The next full reconcile rewrites it.", c.Frontend, c.Scope))
			case !c.Matches:
				out.Divergences = append(out.Divergences, fmt.Sprintf("%s %s scope: the maps hold backends %v (kind %s, affinity %ds), kpr wants %v (kind %s, affinity %ds)",
					c.Frontend, c.Scope, c.Have, have.Kind, have.AffinityTimeout, c.Want, want.Kind, want.AffinityTimeout))
			}
			out.Rows = append(out.Rows, c)
		}
	}
	return out, nil
}

// MapFill is how full one map is.
type MapFill struct {
	Map        string `json:"map"`
	Entries    int    `json:"entries"`
	MaxEntries int    `json:"maxEntries"`
}

// Columns are the map, its entries of its size, and the share.
func (m MapFill) Columns() []string {
	pct := 0.0
	if m.MaxEntries > 0 {
		pct = 100 * float64(m.Entries) / float64(m.MaxEntries)
	}
	return []string{m.Map, fmt.Sprintf("%d / %d", m.Entries, m.MaxEntries), fmt.Sprintf("%.1f%%", pct)}
}

// SockCounters are one socket hook's datapath counters.
type SockCounters struct{ maps.SockHookStats }

// Columns are the hook and its counters.
func (s SockCounters) Columns() []string {
	return []string{s.Hook, fmt.Sprint(s.Translated), fmt.Sprint(s.Rejected), fmt.Sprint(s.Passed), fmt.Sprint(s.Bypassed)}
}

// InspectNode is the fill of every map and the socket hooks' counters
// since the dataplane was first loaded.
func (in *Inspector) InspectNode() []dataplane.Inspection {
	fill := dataplane.Inspection{Key: "maps", Title: "maps", Rows: []dataplane.InspectedRow{}}
	for _, u := range in.lb.Usage() {
		fill.Rows = append(fill.Rows, MapFill{Map: u.Map, Entries: u.Entries, MaxEntries: u.MaxEntries})
	}
	counters := dataplane.Inspection{Key: "sockCounters", Title: "socket hook counters (since the dataplane was first loaded)",
		Header: []string{"hook", "translated", "rejected (no endpoints)", "passed", "bypassed (pod left to the packet path)"}, Rows: []dataplane.InspectedRow{}}
	err := in.sockStats(func(h metrics.SockHookCounts) {
		counters.Rows = append(counters.Rows, SockCounters{maps.SockHookStats{Hook: h.Hook, Translated: h.Translated, Rejected: h.Rejected, Passed: h.Passed, Bypassed: h.Bypassed}})
	})
	if err != nil {
		counters.Error = err.Error()
	}
	return []dataplane.Inspection{fill, counters}
}

// SockCounts reads the socket hooks' counters from m, a kpr_sock_stats map,
// at every call: the Prometheus collector's and `kpr status`'s source.
func SockCounts(m *ebpf.Map) metrics.SockCounts {
	return func(emit func(metrics.SockHookCounts)) error {
		stats, err := maps.SockStats(m)
		if err != nil {
			return err
		}
		for _, s := range stats {
			emit(metrics.SockHookCounts{Hook: s.Hook, Translated: s.Translated, Rejected: s.Rejected, Passed: s.Passed, Bypassed: s.Bypassed})
		}
		return nil
	}
}
