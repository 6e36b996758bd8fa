package watcher

import (
	"testing"
	"time"
)

// Two Services with one ClusterIP (the API server never allocates that, but
// a restored etcd or a hand-edited object can): the dataplane is never
// handed both with the frontend, and gets it for the second Service in the
// sync in which the first lets it go.
func TestDataplaneIsNeverHandedASharedFrontend(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.1")
	h.putService("b", "10.96.0.1")
	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.2")
	h.start()

	c := h.nextCall()
	if n := len(c.ports[portName("a")].Frontends); n != 1 {
		t.Fatalf("a, first in name order, is handed %d frontends, want its ClusterIP", n)
	}
	if sp := c.ports[portName("b")]; sp == nil || len(sp.Frontends) != 0 {
		t.Fatalf("b is handed %+v, want it without the frontend a serves", sp)
	}

	h.deleteService("a")
	c = h.nextCall()
	expectPorts(t, c, []string{"b"}, []string{"a"})
	if got := backends(c.ports[portName("b")]); len(got) != 1 || got[0] != "10.0.0.2:8080" {
		t.Fatalf("once a left, b is handed backends %v, want its own", got)
	}
}
