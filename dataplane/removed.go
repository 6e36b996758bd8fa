package dataplane

import "net/netip"

// RemovedBackend is a backend that no longer serves a UDP frontend. UDP has
// no connection for the dataplane to end, so whatever still sends from
// Frontend to Backend (a connected socket, a conntrack entry) keeps going to
// an endpoint that has left: every backend removes that state once the new
// backends are in place, as kube-proxy's conntrack cleanup does.
type RemovedBackend struct {
	Frontend netip.AddrPort
	Backend  netip.AddrPort
}

// RemovedUDPBackends returns the backends that served a UDP frontend of old
// for traffic from inside the cluster (Frontend.Backends) and do not serve
// that frontend in next: either they left its backend set, or the frontend
// or the whole ServicePort (next nil) went away. Each pair is listed once.
// Both may be nil.
func RemovedUDPBackends(old, next *ServicePort) []RemovedBackend {
	if old == nil {
		return nil
	}
	stays := map[RemovedBackend]bool{}
	if next != nil {
		for _, fe := range next.Frontends {
			if fe.Protocol != UDP {
				continue
			}
			for _, b := range fe.Backends {
				stays[pair(fe, b)] = true
			}
		}
	}
	var out []RemovedBackend
	for _, fe := range old.Frontends {
		if fe.Protocol != UDP {
			continue
		}
		for _, b := range fe.Backends {
			if p := pair(fe, b); !stays[p] {
				stays[p] = true // listed once
				out = append(out, p)
			}
		}
	}
	return out
}

func pair(fe Frontend, b Backend) RemovedBackend {
	return RemovedBackend{
		Frontend: netip.AddrPortFrom(fe.Addr.Unmap(), fe.Port),
		Backend:  netip.AddrPortFrom(b.Addr.Unmap(), b.Port),
	}
}
