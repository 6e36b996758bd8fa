package maps

import (
	"net/netip"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// RemovedBackend is a backend that left a UDP frontend's internal scope (the
// one the socket hooks translate with), or whose frontend was deleted.
// Connected UDP sockets kpr sent from Frontend to Backend are now stale.
type RemovedBackend struct {
	Frontend netip.AddrPort
	Backend  netip.AddrPort
}

// SockTermKey is r as the socket-termination iterator looks it up.
func (r RemovedBackend) SockTermKey() bpf.KprSockTermKey {
	return bpf.KprSockTermKey{
		BackendAddr:  addrToBPF(r.Backend.Addr()),
		BackendPort:  portToBPF(r.Backend.Port()),
		FrontendAddr: addrToBPF(r.Frontend.Addr()),
		FrontendPort: portToBPF(r.Frontend.Port()),
	}
}

// RecordRemovedUDPBackends makes the LB remember every backend that leaves
// a UDP frontend from now on, until TakeRemovedUDPBackends hands them out.
// Off by default, so that an LB nobody drains does not grow.
func (lb *LB) RecordRemovedUDPBackends() { lb.recordRemoved = true }

// TakeRemovedUDPBackends returns the backends that left UDP frontends since
// the last call, each pair once, and forgets them. Only changes the maps
// already serve are listed: a refused or rolled-back write lists nothing.
func (lb *LB) TakeRemovedUDPBackends() []RemovedBackend {
	out := lb.removed
	lb.removed = nil
	return out
}

// noteRemoved records the backends of old that are not in next, for a UDP
// frontend in the internal scope. It runs before release, while the
// removed ids still resolve to addresses.
func (lb *LB) noteRemoved(key VIPKey, old, next []uint32) {
	if !lb.recordRemoved || key.Proto != dataplane.UDP || key.Scope != ScopeInternal || len(old) == 0 {
		return
	}
	stay := make(map[uint32]struct{}, len(next))
	for _, id := range next {
		stay[id] = struct{}{}
	}
	fe := netip.AddrPortFrom(key.Addr, key.Port)
	for _, id := range old {
		if _, ok := stay[id]; ok || id == 0 {
			continue
		}
		e, ok := lb.backendOf[id]
		if !ok {
			continue
		}
		stay[id] = struct{}{} // a backend in two slots is listed once
		lb.removed = append(lb.removed, RemovedBackend{Frontend: fe, Backend: netip.AddrPortFrom(e.addr.Addr(), e.addr.port)})
	}
}
