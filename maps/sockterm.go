package maps

import (
	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// SockTermTargets is the socket-termination iterator's target map: while
// the iterator runs, it destroys the connected UDP sockets that kpr
// translated from a target's frontend to its backend. It is written through
// the same table code as the LB's maps.
type SockTermTargets struct {
	t table[bpf.KprSockTermKey, uint8]
}

// NewSockTermTargets returns the writer of m (the kpr_sock_term map).
func NewSockTermTargets(m *ebpf.Map) *SockTermTargets {
	return &SockTermTargets{t: newBPFTable[bpf.KprSockTermKey, uint8](m)}
}

// Capacity is how many targets fit at once.
func (s *SockTermTargets) Capacity() int { return s.t.maxEntries() }

// Set adds targets; at most Capacity may be set at once.
func (s *SockTermTargets) Set(targets []dataplane.RemovedBackend) error {
	return s.t.put(sockTermKeys(targets), make([]uint8, len(targets)))
}

// Clear removes targets; missing ones are not an error.
func (s *SockTermTargets) Clear(targets []dataplane.RemovedBackend) error {
	return s.t.delete(sockTermKeys(targets))
}

// sockTermKeys encodes targets as the iterator looks them up, addresses
// v4-mapped as kpr_sock_rev stores them.
func sockTermKeys(targets []dataplane.RemovedBackend) []bpf.KprSockTermKey {
	keys := make([]bpf.KprSockTermKey, len(targets))
	for i, r := range targets {
		keys[i] = bpf.KprSockTermKey{
			BackendAddr:  addrToBPF(r.Backend.Addr()),
			BackendPort:  portToBPF(r.Backend.Port()),
			FrontendAddr: addrToBPF(r.Frontend.Addr()),
			FrontendPort: portToBPF(r.Frontend.Port()),
		}
	}
	return keys
}
