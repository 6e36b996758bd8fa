package dataplane

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func spn(n string) ServicePortName {
	return ServicePortName{Namespace: "default", Name: n, Protocol: TCP}
}

func fe(addr string, kind FrontendKind, backend string) Frontend {
	return Frontend{Addr: netip.MustParseAddr(addr), Port: 80, Protocol: TCP, Kind: kind,
		Backends: []Backend{{Addr: netip.MustParseAddr(backend), Port: 8080}}}
}

func sp(frontends ...Frontend) *ServicePort { return &ServicePort{Frontends: frontends} }

// serves returns the addresses of the frontends out gives name.
func serves(out map[ServicePortName]*ServicePort, name ServicePortName) []string {
	var addrs []string
	if out[name] == nil {
		return nil
	}
	for _, f := range out[name].Frontends {
		addrs = append(addrs, f.Addr.String())
	}
	return addrs
}

// desiredState keeps what a sync loop keeps: the desired (unresolved)
// state of every ServicePort, updated once a sync succeeds.
type desiredState map[ServicePortName]*ServicePort

func (d desiredState) held(name ServicePortName) *ServicePort { return d[name] }

func (d desiredState) commit(changes map[ServicePortName]*ServicePort) {
	for name, s := range changes {
		if s == nil {
			delete(d, name)
		} else {
			d[name] = s
		}
	}
}

func TestConflictingFrontendKeepsTheFirstOwner(t *testing.T) {
	c, d := NewClaims(), desiredState{}
	first := map[ServicePortName]*ServicePort{spn("z"): sp(fe("10.96.0.1", ClusterIP, "10.244.0.2"))}
	out, conflicts := c.Resolve(first, d.held)
	c.Done(true)
	d.commit(first)
	if len(conflicts) != 0 || out[spn("z")] != first[spn("z")] {
		t.Fatalf("a ServicePort without conflicts was changed: %v %v", out, conflicts)
	}
	// "a" sorts first but comes later: the owner keeps the frontend.
	second := map[ServicePortName]*ServicePort{spn("a"): sp(fe("10.96.0.1", ClusterIP, "10.244.0.3"), fe("10.96.0.2", ClusterIP, "10.244.0.3"))}
	out, conflicts = c.Resolve(second, d.held)
	c.Done(true)
	d.commit(second)
	if got := serves(out, spn("a")); !slices.Equal(got, []string{"10.96.0.2"}) {
		t.Fatalf("the later ServicePort is handed %v, want only its own frontend", got)
	}
	if len(conflicts) != 1 || conflicts[0].Winner != spn("z") || conflicts[0].Loser != spn("a") {
		t.Fatalf("conflicts %+v, want z keeping 10.96.0.1 against a", conflicts)
	}
	if _, ok := out[spn("z")]; ok {
		t.Fatal("the owner was handed over again though nothing of it changed")
	}
	// Deleting the loser leaves the owner alone.
	out, _ = c.Resolve(map[ServicePortName]*ServicePort{spn("a"): nil}, d.held)
	c.Done(true)
	if _, ok := out[spn("z")]; ok || len(out) != 1 {
		t.Fatalf("deleting the loser changed %v", out)
	}
	if owner, _ := c.Owner(first[spn("z")].Frontends[0].ID()); owner != spn("z") {
		t.Fatalf("after the loser left, the frontend belongs to %v", owner)
	}
}

func TestCompleteResolutionGoesByName(t *testing.T) {
	c := NewClaims()
	all := map[ServicePortName]*ServicePort{
		spn("b"): sp(fe("10.96.0.1", ClusterIP, "10.244.0.3")),
		spn("a"): sp(fe("10.96.0.1", ClusterIP, "10.244.0.2")),
	}
	for range 20 { // map order must not matter
		out, conflicts := c.ResolveAll(all)
		c.Done(true)
		if !slices.Equal(serves(out, spn("a")), []string{"10.96.0.1"}) || len(serves(out, spn("b"))) != 0 {
			t.Fatalf("a: %v, b: %v; want the frontend with a", serves(out, spn("a")), serves(out, spn("b")))
		}
		if out[spn("b")] == nil {
			t.Fatal("the loser was dropped instead of handed over without the frontend")
		}
		if len(conflicts) != 1 || conflicts[0].Loser != spn("b") {
			t.Fatalf("conflicts %+v", conflicts)
		}
	}
}

func TestClusterIPKeepsItsFrontendAgainstAnExternalIP(t *testing.T) {
	// "a-intruder" sorts first and asks for 10.96.0.1 as an external IP.
	intruder := sp(fe("10.96.0.1", ExternalIP, "10.244.0.9"), fe("192.0.2.1", ExternalIP, "10.244.0.9"))
	owner := sp(fe("10.96.0.1", ClusterIP, "10.244.0.2"))
	all := map[ServicePortName]*ServicePort{spn("a-intruder"): intruder, spn("b-owner"): owner}

	c := NewClaims()
	out, _ := c.ResolveAll(all)
	c.Done(true)
	if out[spn("b-owner")] != owner || !slices.Equal(serves(out, spn("a-intruder")), []string{"192.0.2.1"}) {
		t.Fatalf("complete resolution: owner %v, intruder %v", serves(out, spn("b-owner")), serves(out, spn("a-intruder")))
	}

	// The intruder came first, in an earlier sync: the ClusterIP's Service
	// still takes the frontend, and the intruder is handed over without it
	// in the same sync.
	c, d := NewClaims(), desiredState{}
	first := map[ServicePortName]*ServicePort{spn("a-intruder"): intruder}
	c.Resolve(first, d.held)
	c.Done(true)
	d.commit(first)
	out, conflicts := c.Resolve(map[ServicePortName]*ServicePort{spn("b-owner"): owner}, d.held)
	c.Done(true)
	if out[spn("b-owner")] != owner {
		t.Fatalf("the ClusterIP's own Service is handed %v", serves(out, spn("b-owner")))
	}
	if !slices.Equal(serves(out, spn("a-intruder")), []string{"192.0.2.1"}) {
		t.Fatalf("the intruder is handed %v, want it re-sent without the ClusterIP", serves(out, spn("a-intruder")))
	}
	if len(conflicts) != 1 || conflicts[0].Winner != spn("b-owner") || conflicts[0].LoserKind != ExternalIP {
		t.Fatalf("conflicts %+v", conflicts)
	}
}

// A frontend denied to one Service goes to it in the same sync in which
// its owner lets it go, though that Service itself did not change.
func TestOwnerLeavingHandsTheContestedFrontendOver(t *testing.T) {
	c, d := NewClaims(), desiredState{}
	a := sp(fe("10.96.0.1", ClusterIP, "10.244.0.2"))
	b := sp(fe("10.96.0.1", ClusterIP, "10.244.0.3"), fe("10.96.0.5", ClusterIP, "10.244.0.3"))
	all := map[ServicePortName]*ServicePort{spn("a"): a, spn("b"): b}
	c.ResolveAll(all)
	c.Done(true)
	d.commit(all)

	// a moves to another address: 10.96.0.1 is let go.
	moved := sp(fe("10.96.0.7", ClusterIP, "10.244.0.2"))
	changes := map[ServicePortName]*ServicePort{spn("a"): moved}
	out, _ := c.Resolve(changes, d.held)
	c.Done(true)
	d.commit(changes)
	if out[spn("a")] != moved {
		t.Fatalf("a is handed %v", serves(out, spn("a")))
	}
	if out[spn("b")] != b {
		t.Fatalf("b is handed %v, want its whole desired state now that the frontend is free", serves(out, spn("b")))
	}
	// Nothing is denied any more: an unrelated change hands nothing else.
	out, conflicts := c.Resolve(map[ServicePortName]*ServicePort{spn("c"): sp(fe("10.96.0.9", ClusterIP, "10.244.0.4"))}, d.held)
	c.Done(true)
	if len(out) != 1 || len(conflicts) != 0 {
		t.Fatalf("an unrelated change handed %v, conflicts %v", out, conflicts)
	}
}

// A sync the dataplane did not take leaves the claims as they were, so
// the retry resolves the same way.
func TestRejectedResolutionIsUndone(t *testing.T) {
	c, d := NewClaims(), desiredState{}
	a := sp(fe("10.96.0.1", ClusterIP, "10.244.0.2"))
	b := sp(fe("10.96.0.1", ClusterIP, "10.244.0.3"))
	all := map[ServicePortName]*ServicePort{spn("a"): a, spn("b"): b}
	c.ResolveAll(all)
	c.Done(true)
	d.commit(all)

	changes := map[ServicePortName]*ServicePort{spn("a"): nil}
	first, _ := c.Resolve(changes, d.held)
	c.Done(false)
	if owner, _ := c.Owner(a.Frontends[0].ID()); owner != spn("a") {
		t.Fatalf("after a rejected sync the frontend belongs to %v, want a still", owner)
	}
	again, _ := c.Resolve(changes, d.held)
	c.Done(true)
	if len(again) != len(first) || again[spn("b")] != b {
		t.Fatalf("the retry handed %v, the first try %v", again, first)
	}

	// A rejected complete resolution changes nothing either.
	c.ResolveAll(map[ServicePortName]*ServicePort{spn("x"): sp(fe("10.96.0.1", ClusterIP, "10.244.0.9"))})
	c.Done(false)
	if owner, _ := c.Owner(a.Frontends[0].ID()); owner != spn("b") {
		t.Fatalf("a rejected ResolveAll took effect: owner %v", owner)
	}
}

func TestV4MappedFrontendIsTheSameFrontend(t *testing.T) {
	mapped := fe("::ffff:10.96.0.1", ExternalIP, "10.244.0.3")
	if mapped.ID() != fe("10.96.0.1", ClusterIP, "10.244.0.2").ID() {
		t.Fatal("a v4-mapped address is a different frontend")
	}
}

// Random partial syncs, some of them rejected by the dataplane: whatever
// the history, the state handed to the dataplane never has a frontend
// twice, and every frontend some ServicePort asks for is served by one of
// them (a frontend let go never stays unserved while another wants it).
func TestClaimsKeepEveryFrontendServedOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	addrs := []string{"10.96.0.1", "10.96.0.2", "10.96.0.3", "192.0.2.1", "192.0.2.2"}
	kinds := []FrontendKind{ClusterIP, NodePort, ExternalIP, LoadBalancer}
	names := []ServicePortName{spn("a"), spn("b"), spn("c"), spn("d"), spn("e")}
	randomSP := func() *ServicePort {
		if rng.IntN(4) == 0 {
			return nil
		}
		var fes []Frontend
		for range 1 + rng.IntN(3) {
			fes = append(fes, fe(addrs[rng.IntN(len(addrs))], kinds[rng.IntN(len(kinds))], "10.244.0.2"))
		}
		return sp(fes...)
	}
	for run := range 200 {
		c, d := NewClaims(), desiredState{}
		handed := map[ServicePortName]*ServicePort{}
		for step := range 30 {
			changes := map[ServicePortName]*ServicePort{}
			for range 1 + rng.IntN(2) {
				changes[names[rng.IntN(len(names))]] = randomSP()
			}
			var out map[ServicePortName]*ServicePort
			if step%7 == 0 {
				all := map[ServicePortName]*ServicePort{}
				for n, s := range d {
					all[n] = s
				}
				for n, s := range changes {
					all[n] = s
				}
				changes = all
				out, _ = c.ResolveAll(all)
			} else {
				out, _ = c.Resolve(changes, d.held)
			}
			if rng.IntN(5) == 0 { // the dataplane did not take it
				c.Done(false)
				continue
			}
			c.Done(true)
			d.commit(changes)
			if step%7 == 0 {
				clear(handed)
			}
			for n, s := range out {
				if s == nil {
					delete(handed, n)
				} else {
					handed[n] = s
				}
			}
			servedBy := map[FrontendID]ServicePortName{}
			for n, s := range handed {
				for _, f := range s.Frontends {
					if other, ok := servedBy[f.ID()]; ok && other != n {
						t.Fatalf("run %d step %d: %v handed to both %v and %v", run, step, f.ID(), other, n)
					}
					servedBy[f.ID()] = n
				}
			}
			for n, s := range d {
				for _, f := range s.Frontends {
					if _, ok := servedBy[f.ID()]; !ok {
						t.Fatalf("run %d step %d: %v asks for %v and nobody serves it", run, step, n, f.ID())
					}
				}
			}
		}
	}
}
