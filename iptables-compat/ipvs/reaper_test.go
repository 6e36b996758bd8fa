package ipvs

import (
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
)

func clusterIPPort(proto dataplane.Protocol, bs ...string) *dataplane.ServicePort {
	return &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: proto},
		Frontends: []dataplane.Frontend{fe(dataplane.ClusterIP, "10.96.0.1:80", proto, backends(bs...), nil)}}
}

func weights(t *testing.T, k *fakeKernel, key ServiceKey) map[string]int {
	t.Helper()
	ds, err := k.Dests(key)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for b, d := range ds {
		out[b.String()] = d.Weight
	}
	return out
}

// A TCP real server that leaves drains: weight 0 while it has
// connections, deleted by the reaper once it has none.
func TestRemovedTCPRealServerDrainsThenGoes(t *testing.T) {
	k, run := newFakes()
	p := fakePlane(t, k, run)
	key := addrKey(netipAddr("10.96.0.1"), dataplane.TCP, 80)
	sp := clusterIPPort(dataplane.TCP, "10.244.0.1:8080", "10.244.0.2:8080")
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
		t.Fatal(err)
	}
	k.setConns(key, backends("10.244.0.2:8080")[0], 3)
	next := clusterIPPort(dataplane.TCP, "10.244.0.1:8080")
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: next}); err != nil {
		t.Fatal(err)
	}
	if got := weights(t, k, key); got["10.244.0.2:8080"] != 0 || len(got) != 2 {
		t.Fatalf("after its endpoint left, the real servers are %v, want 10.244.0.2:8080 kept at weight 0", got)
	}
	if n, err := p.Reap(); err != nil || n != 0 {
		t.Fatalf("Reap with connections left = %d, %v; want nothing deleted", n, err)
	}
	if got := weights(t, k, key); len(got) != 2 {
		t.Fatalf("the reaper deleted a real server with connections: %v", got)
	}
	k.setConns(key, backends("10.244.0.2:8080")[0], 0)
	if n, err := p.Reap(); err != nil || n != 1 {
		t.Fatalf("Reap after the connections ended = %d, %v; want 1 deleted", n, err)
	}
	if got := weights(t, k, key); len(got) != 1 || got["10.244.0.1:8080"] != 1 {
		t.Fatalf("after the reaper, the real servers are %v, want 10.244.0.1:8080 alone", got)
	}
	// The Plane's view followed the reaper: no drift.
	if held := dataplanetest.DriftCheckHolds(t, p); !held {
		t.Error("the drift check finds drift after the reaper deleted a drained real server")
	}
}

// A drained real server whose endpoint comes back serves again.
func TestDrainedRealServerComesBack(t *testing.T) {
	k, run := newFakes()
	p := fakePlane(t, k, run)
	key := addrKey(netipAddr("10.96.0.1"), dataplane.TCP, 80)
	two := clusterIPPort(dataplane.TCP, "10.244.0.1:8080", "10.244.0.2:8080")
	for _, sp := range []*dataplane.ServicePort{two, clusterIPPort(dataplane.TCP, "10.244.0.1:8080"), clusterIPPort(dataplane.TCP, "10.244.0.1:8080", "10.244.0.2:8080")} {
		if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
			t.Fatal(err)
		}
	}
	if got := weights(t, k, key); got["10.244.0.2:8080"] != 1 {
		t.Fatalf("the real servers are %v, want 10.244.0.2:8080 back at weight 1", got)
	}
}

// UDP has no connection that ends: a UDP real server goes at once.
func TestRemovedUDPRealServerGoesAtOnce(t *testing.T) {
	k, run := newFakes()
	p := fakePlane(t, k, run)
	key := addrKey(netipAddr("10.96.0.1"), dataplane.UDP, 80)
	sp := clusterIPPort(dataplane.UDP, "10.244.0.1:8080", "10.244.0.2:8080")
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
		t.Fatal(err)
	}
	k.setConns(key, backends("10.244.0.2:8080")[0], 3)
	next := clusterIPPort(dataplane.UDP, "10.244.0.1:8080")
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: next}); err != nil {
		t.Fatal(err)
	}
	if got := weights(t, k, key); len(got) != 1 {
		t.Fatalf("after a UDP endpoint left, the real servers are %v, want it deleted at once", got)
	}
}
