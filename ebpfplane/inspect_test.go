package ebpfplane

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
)

func inMemoryInspector(lb *maps.LB, sockStats metrics.SockCounts) *Inspector {
	return &Inspector{lb: lb, sockStats: sockStats, close: func() {}}
}

// What the Plane wrote reads back as matching; an entry deleted or
// changed behind its back is named, with what the maps hold.
func TestInspectPortsComparesEveryEntry(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	a, b := be("10.244.0.2:8080"), be("10.244.1.2:8080")
	web, api := clusterIP("10.96.0.1", a, b), clusterIP("10.96.0.2", a)
	web.Name, api.Name = name("web"), name("api")
	if err := New(lb, nil).Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web.Name: web, api.Name: api}); err != nil {
		t.Fatal(err)
	}
	// Like OpenInspector, each reading opens the maps afresh.
	got, err := inMemoryInspector(lb.ReopenInMemory(true), nil).InspectPorts([]dataplane.ServicePort{*web, *api})
	if err != nil || len(got.Divergences) != 0 || len(got.Rows) != 2 || got.Key != "maps" {
		t.Fatalf("InspectPorts of what the Plane wrote = %+v, %v; want two matching rows under maps", got, err)
	}
	if err := lb.ReopenInMemory(false).Delete(key("10.96.0.1", maps.ScopeInternal)); err != nil {
		t.Fatal(err)
	}
	other := lb.ReopenInMemory(false)
	svc, _ := other.Get(key("10.96.0.2", maps.ScopeInternal))
	svc.Backends = []dataplane.Backend{b}
	if err := other.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	got, err = inMemoryInspector(lb.ReopenInMemory(true), nil).InspectPorts([]dataplane.ServicePort{*web, *api})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, r := range got.Rows {
		lines = append(lines, r.Columns()...)
	}
	for _, want := range []string{"10.96.0.1:80/TCP internal: MISSING", "10.96.0.2:80/TCP internal: DIFFERS: holds 10.244.1.2:8080"} {
		if !slices.Contains(lines, want) {
			t.Errorf("rows lack %q:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if len(got.Divergences) != 2 || !strings.Contains(got.Divergences[0], "missing from the service map") ||
		!strings.Contains(got.Divergences[1], "the maps hold backends [10.244.1.2:8080]") {
		t.Errorf("divergences %q: want the missing entry and the changed one", got.Divergences)
	}
}

// The node's reading is every map's fill and the socket hooks' counters;
// counters that cannot be read say why and leave the fill shown.
func TestInspectNodeShowsFillAndCounters(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	if err := New(lb, nil).Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): clusterIP("10.96.0.1", be("10.244.0.2:8080"))}); err != nil {
		t.Fatal(err)
	}
	in := inMemoryInspector(lb.ReopenInMemory(true), func(emit func(metrics.SockHookCounts)) error {
		emit(metrics.SockHookCounts{Hook: "connect4", Translated: 3, Rejected: 1, Passed: 7, Bypassed: 2})
		return nil
	})
	secs := in.InspectNode()
	if len(secs) != 2 || secs[0].Key != "maps" || secs[1].Key != "sockCounters" {
		t.Fatalf("InspectNode = %+v, want maps and sockCounters", secs)
	}
	services := secs[0].Rows[0].(MapFill)
	if services.Entries == 0 || services.MaxEntries != 1000 {
		t.Errorf("service map fill %+v, want the entries written of 1000", services)
	}
	if c := secs[1].Rows[0].Columns(); !slices.Equal(c, []string{"connect4", "3", "1", "7", "2"}) {
		t.Errorf("counters row %q", c)
	}
	in.sockStats = func(func(metrics.SockHookCounts)) error { return errors.New("no counters map") }
	secs = in.InspectNode()
	if secs[1].Error != "no counters map" || len(secs[0].Rows) == 0 {
		t.Errorf("with unreadable counters: %+v", secs)
	}
}
