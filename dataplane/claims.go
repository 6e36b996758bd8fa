package dataplane

import (
	"net/netip"
	"slices"
)

// FrontendID is what makes two frontends the same frontend: a dataplane
// can send one address, port and protocol to one backend set only.
type FrontendID struct {
	Addr     netip.Addr // never v4-mapped
	Port     uint16
	Protocol Protocol
}

// ID returns the frontend's identity.
func (f Frontend) ID() FrontendID {
	return FrontendID{Addr: f.Addr.Unmap(), Port: f.Port, Protocol: f.Protocol}
}

func (id FrontendID) String() string {
	return netip.AddrPortFrom(id.Addr, id.Port).String() + "/" + id.Protocol.String()
}

// Conflict is a frontend that two ServicePorts asked for. Winner serves it;
// Loser is handed to the dataplane without it until Winner lets it go.
type Conflict struct {
	Frontend   FrontendID
	Winner     ServicePortName
	WinnerKind FrontendKind
	Loser      ServicePortName
	LoserKind  FrontendKind
}

// Claims decides which ServicePort serves each frontend, so that the
// ServicePorts handed to a dataplane never share one (the contract every
// backend relies on). Two Services asking for one frontend is bad input, not
// a dataplane failure: one keeps it, the other is served without it, and the
// sync goes on. The rules, the same for every backend:
//
//   - A ClusterIP belongs to its Service. The API server allocates a
//     ClusterIP to one Service only, so an external IP, load-balancer IP or
//     node address equal to it is the other Service's mistake: the
//     ClusterIP's Service takes the frontend, whoever had it first.
//   - Otherwise the ServicePort that has the frontend keeps it. A complete
//     resolution (ResolveAll) starts afresh and gives it to the first in
//     name order, so the outcome never depends on map order.
//   - A ServicePort denied a frontend gets it in the same sync in which its
//     owner lets go.
//
// Claims is used from one goroutine, the sync loop. Each Resolve or
// ResolveAll must be followed by Done, once the dataplane took (or did not
// take) the result: a failed call leaves the claims as they were.
type Claims struct {
	owner map[FrontendID]claimant
	// denied holds the desired state of every ServicePort handed over
	// without some frontend it asked for: it is resolved again when one
	// of its frontends is let go. There are few, so it is scanned.
	denied map[ServicePortName]*ServicePort

	// undo lists how to restore the state before the last Resolve; fresh
	// is the state a ResolveAll built, swapped in by Done(true).
	undo   []func()
	noUndo bool
	fresh  *Claims
}

// claimant is the ServicePort that serves a frontend, and the kind of
// frontend it asked for it as.
type claimant struct {
	name ServicePortName
	kind FrontendKind
}

// NewClaims returns Claims that know no owners.
func NewClaims() *Claims {
	return &Claims{owner: map[FrontendID]claimant{}, denied: map[ServicePortName]*ServicePort{}}
}

// ResolveAll resolves the complete desired state from scratch: all is every
// ServicePort there is. It returns what to hand to Dataplane.Reconcile:
// all, with each ServicePort's lost frontends left out (ServicePorts that
// lose none are passed through as the same pointer), and every conflict.
func (c *Claims) ResolveAll(all map[ServicePortName]*ServicePort) (map[ServicePortName]*ServicePort, []Conflict) {
	fresh := NewClaims()
	fresh.noUndo = true // nothing to restore: Done(false) drops fresh
	out, conflicts := fresh.resolve(SortedNames(all), func(name ServicePortName) *ServicePort { return all[name] }, nil)
	fresh.noUndo = false
	c.undo, c.fresh = nil, fresh
	return out, conflicts
}

// Resolve resolves a partial sync. changes are the ServicePorts that
// changed (nil: deleted), held returns the desired state this Claims was
// last given for a ServicePort not in changes, or before this change for
// one in it (nil if none). It returns what to hand to Dataplane.Apply:
// changes with lost frontends left out, plus every other ServicePort whose
// frontends change because of them (one that gets a frontend its owner let
// go, or loses one to a ClusterIP), and the new conflicts.
func (c *Claims) Resolve(changes map[ServicePortName]*ServicePort, held func(ServicePortName) *ServicePort) (map[ServicePortName]*ServicePort, []Conflict) {
	c.undo, c.fresh = nil, nil
	names := SortedNames(changes)
	var freed []FrontendID
	for _, name := range names {
		if old := held(name); old != nil {
			for _, fe := range old.Frontends {
				if id := fe.ID(); c.owns(id, name) {
					c.release(id)
					freed = append(freed, id)
				}
			}
		}
		c.setDenied(name, nil)
	}
	desiredOf := func(name ServicePortName) *ServicePort {
		if sp, ok := changes[name]; ok {
			return sp
		}
		if sp, ok := c.denied[name]; ok {
			return sp
		}
		return held(name)
	}
	return c.resolve(names, desiredOf, freed)
}

// Done ends the last Resolve or ResolveAll: accepted says whether the
// dataplane took its result. If not, the claims are as before it.
func (c *Claims) Done(accepted bool) {
	if accepted && c.fresh != nil {
		c.owner, c.denied = c.fresh.owner, c.fresh.denied
	}
	if !accepted {
		for i := len(c.undo) - 1; i >= 0; i-- {
			c.undo[i]()
		}
	}
	c.undo, c.fresh = nil, nil
}

// owns reports whether name serves id.
func (c *Claims) owns(id FrontendID, name ServicePortName) bool {
	cl, ok := c.owner[id]
	return ok && cl.name == name
}

// Owner returns the ServicePort serving a frontend, for display.
func (c *Claims) Owner(id FrontendID) (ServicePortName, bool) {
	cl, ok := c.owner[id]
	return cl.name, ok
}

// resolve claims the frontends of names, in that order, ClusterIPs first,
// then hands over what is let go, until nothing changes.
func (c *Claims) resolve(names []ServicePortName, desiredOf func(ServicePortName) *ServicePort, freed []FrontendID) (map[ServicePortName]*ServicePort, []Conflict) {
	out := make(map[ServicePortName]*ServicePort, len(names))
	var conflicts []Conflict
	for work := names; len(work) > 0; {
		var losers []ServicePortName
		for _, clusterIPs := range []bool{true, false} {
			for _, name := range work {
				sp := desiredOf(name)
				if sp == nil {
					continue
				}
				for _, fe := range sp.Frontends {
					if (fe.Kind == ClusterIP) != clusterIPs {
						continue
					}
					cf, lost := c.claim(fe, name)
					if cf != nil && !slices.ContainsFunc(conflicts, func(o Conflict) bool {
						return o.Frontend == cf.Frontend && o.Loser == cf.Loser
					}) {
						conflicts = append(conflicts, *cf)
					}
					if lost {
						losers = append(losers, cf.Loser)
					}
				}
			}
		}
		for _, name := range work {
			out[name] = c.served(name, desiredOf(name))
		}
		// Next round: ServicePorts that lost a frontend to a ClusterIP,
		// and denied ones that can have a frontend that was let go.
		work = losers
		for _, name := range c.deniedWanting(freed) {
			if !slices.Contains(work, name) {
				work = append(work, name)
			}
		}
		slices.SortFunc(work, ServicePortName.Compare)
		freed = nil
	}
	return out, conflicts
}

// claim gives fe to name if it is free or name may take it. It returns the
// conflict, if any, and whether an earlier owner lost the frontend.
func (c *Claims) claim(fe Frontend, name ServicePortName) (*Conflict, bool) {
	id := fe.ID()
	cur, owned := c.owner[id]
	if !owned || cur.name == name {
		if !owned {
			c.own(id, claimant{name: name, kind: fe.Kind})
		}
		return nil, false
	}
	if fe.Kind == ClusterIP && cur.kind != ClusterIP {
		c.own(id, claimant{name: name, kind: fe.Kind})
		return &Conflict{Frontend: id, Winner: name, WinnerKind: fe.Kind, Loser: cur.name, LoserKind: cur.kind}, true
	}
	return &Conflict{Frontend: id, Winner: cur.name, WinnerKind: cur.kind, Loser: name, LoserKind: fe.Kind}, false
}

// served returns sp without the frontends name does not own, and records
// name as denied if that left any out. sp itself is returned when nothing
// was left out, so the dataplane sees an unchanged ServicePort unchanged.
func (c *Claims) served(name ServicePortName, sp *ServicePort) *ServicePort {
	if sp == nil {
		c.setDenied(name, nil)
		return nil
	}
	owns := func(fe Frontend) bool { return c.owns(fe.ID(), name) }
	if !slices.ContainsFunc(sp.Frontends, func(fe Frontend) bool { return !owns(fe) }) {
		c.setDenied(name, nil)
		return sp
	}
	c.setDenied(name, sp)
	kept := *sp
	kept.Frontends = nil
	for _, fe := range sp.Frontends {
		if owns(fe) {
			kept.Frontends = append(kept.Frontends, fe)
		}
	}
	return &kept
}

// deniedWanting returns the denied ServicePorts that ask for one of ids
// while nobody owns it.
func (c *Claims) deniedWanting(ids []FrontendID) []ServicePortName {
	var out []ServicePortName
	for _, id := range ids {
		if _, owned := c.owner[id]; owned {
			continue
		}
		for name, sp := range c.denied {
			if !slices.Contains(out, name) && slices.ContainsFunc(sp.Frontends, func(fe Frontend) bool { return fe.ID() == id }) {
				out = append(out, name)
			}
		}
	}
	return out
}

func (c *Claims) own(id FrontendID, cl claimant) {
	prev, had := c.owner[id]
	c.owner[id] = cl
	c.journal(func() {
		if had {
			c.owner[id] = prev
		} else {
			delete(c.owner, id)
		}
	})
}

func (c *Claims) release(id FrontendID) {
	prev := c.owner[id]
	delete(c.owner, id)
	c.journal(func() { c.owner[id] = prev })
}

func (c *Claims) setDenied(name ServicePortName, sp *ServicePort) {
	prev, had := c.denied[name]
	if !had && sp == nil || had && prev == sp {
		return
	}
	if sp == nil {
		delete(c.denied, name)
	} else {
		c.denied[name] = sp
	}
	c.journal(func() {
		if had {
			c.denied[name] = prev
		} else {
			delete(c.denied, name)
		}
	})
}

// journal records how to undo a change, unless nothing will be undone.
func (c *Claims) journal(undo func()) {
	if !c.noUndo {
		c.undo = append(c.undo, undo)
	}
}

// SortedNames returns the names of sps in name order (ServicePortName.Compare):
// the order in which conflicts are resolved and, where not everything fits,
// room is given, so that neither depends on Go's map order.
func SortedNames[V any](sps map[ServicePortName]V) []ServicePortName {
	names := make([]ServicePortName, 0, len(sps))
	for name := range sps {
		names = append(names, name)
	}
	slices.SortFunc(names, ServicePortName.Compare)
	return names
}
