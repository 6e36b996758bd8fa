package ipvs

import (
	"maps"
	"net/netip"

	"github.com/kpr-io/kpr/dataplane"
)

// kstate is the kernel state the Plane owns: read from the kernel (read),
// or wanted (want). Real servers carry their weights; wanted ones weight 1.
type kstate struct {
	services map[ServiceKey]*ServiceState
	bound    map[netip.Addr]bool
	entries  map[setEntry]bool
	// internal is the marks the nat rules give the node's own traffic.
	internal map[ServiceKey]uint32
}

func newKState() *kstate {
	return &kstate{services: map[ServiceKey]*ServiceState{}, bound: map[netip.Addr]bool{},
		entries: map[setEntry]bool{}, internal: map[ServiceKey]uint32{}}
}

func (t *kstate) clone() *kstate {
	out := newKState()
	for k, s := range t.services {
		out.services[k] = s.clone()
	}
	maps.Copy(out.bound, t.bound)
	maps.Copy(out.entries, t.entries)
	maps.Copy(out.internal, t.internal)
	return out
}

func (s *ServiceState) clone() *ServiceState {
	return &ServiceState{Service: s.Service, Dests: maps.Clone(s.Dests)}
}

// want is the union of the contributions.
func want(contribs map[dataplane.ServicePortName]*contribution) *kstate {
	t := newKState()
	for _, c := range contribs {
		t.add(c)
	}
	return t
}

func (t *kstate) add(c *contribution) {
	for k, ws := range c.services {
		ss := &ServiceState{Service: ws.Service, Dests: map[dataplane.Backend]Dest{}}
		for _, b := range ws.backends {
			ss.Dests[b] = Dest{Weight: 1}
		}
		t.services[k] = ss
	}
	for _, a := range c.bind {
		t.bound[a] = true
	}
	for _, e := range c.entries {
		t.entries[e] = true
	}
	maps.Copy(t.internal, c.internal)
}

// touched are the parts of the tables a write looks at; nil fields mean
// everything.
type touched struct {
	services map[ServiceKey]bool
	bound    map[netip.Addr]bool
	entries  map[setEntry]bool
}

func (tc *touched) add(c *contribution) {
	if c == nil {
		return
	}
	for k := range c.services {
		tc.services[k] = true
	}
	for _, a := range c.bind {
		tc.bound[a] = true
	}
	for _, e := range c.entries {
		tc.entries[e] = true
	}
}

func newTouched() *touched {
	return &touched{services: map[ServiceKey]bool{}, bound: map[netip.Addr]bool{}, entries: map[setEntry]bool{}}
}

// everything touches every part of both.
func everything(a, b *kstate) *touched {
	tc := newTouched()
	for _, t := range []*kstate{a, b} {
		for k := range t.services {
			tc.services[k] = true
		}
		for k := range t.bound {
			tc.bound[k] = true
		}
		for k := range t.entries {
			tc.entries[k] = true
		}
	}
	return tc
}
