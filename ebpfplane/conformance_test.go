package ebpfplane_test

import (
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/maps"
)

// The eBPF backend over in-memory maps passes the dataplane conformance
// suite. The observer reads the tables through a second, read-only LB, as
// `kpr dump` reads the pinned maps, so it sees what a BPF lookup would, not
// what the Plane's LB believes the maps hold.
func TestConformance(t *testing.T) {
	dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
		return conformanceBackend(t, maps.NewInMemory(1000, 1000, 1000))
	})
}

func conformanceBackend(t *testing.T, lb *maps.LB) dataplanetest.Backend {
	return dataplanetest.Backend{
		Dataplane: ebpfplane.New(lb, zaptest.NewLogger(t)),
		Served:    func() (dataplanetest.State, error) { return served(lb.ReopenInMemory(true)), nil },
		// A restarted kpr opens the pinned maps with a new LB and a new
		// Plane.
		Restart:   func() dataplanetest.Backend { return conformanceBackend(t, lb.ReopenInMemory(false)) },
		Tamper:    tamperer{lb},
		FailWrite: lb.FailInMemoryWrite,
		WithRoom: func(room int) dataplanetest.Backend {
			return conformanceBackend(t, maps.NewInMemory(room, 1000, 1000))
		},
	}
}

// served converts the service map into the suite's terms. A frontend
// without an external-scope entry serves external traffic from its
// internal one, as dataplane.Frontend has it for nil ExternalBackends.
func served(lb *maps.LB) dataplanetest.State {
	out := dataplanetest.State{}
	for _, svc := range lb.List() {
		k := dataplanetest.Key{Addr: svc.Addr, Port: svc.Port, Protocol: svc.Proto, Traffic: dataplanetest.Internal}
		if svc.Scope == maps.ScopeExternal {
			k.Traffic = dataplanetest.External
		}
		s := dataplanetest.Serving{Backends: svc.Backends, AffinityTimeout: time.Duration(svc.AffinityTimeout) * time.Second}
		// Only the tc programs, which see traffic from outside, consult
		// the source ranges a master asks for: what the read-only LB
		// found in the source-range map for a master with the flag.
		ranges := svc.SourceRanges
		if k.Traffic == dataplanetest.External {
			s.SourceRanges = ranges
		}
		out[k] = s
		if k.Traffic == dataplanetest.Internal {
			ext := k
			ext.Traffic = dataplanetest.External
			if _, ok := out[ext]; !ok {
				s.SourceRanges = ranges
				out[ext] = s
			}
		}
	}
	return out
}

// tamperer writes the maps through an LB of its own, which to the Plane's
// LB is a second program writing them.
type tamperer struct{ lb *maps.LB }

func vipKey(k dataplanetest.Key) maps.VIPKey {
	return maps.VIPKey{VIP: maps.VIP{Addr: k.Addr, Port: k.Port, Proto: k.Protocol}, Scope: maps.ScopeInternal}
}

func (tp tamperer) Remove(k dataplanetest.Key) error {
	return tp.lb.ReopenInMemory(false).Delete(vipKey(k))
}

func (tp tamperer) Redirect(k dataplanetest.Key, backends []dataplane.Backend) error {
	other := tp.lb.ReopenInMemory(false)
	svc, ok := other.Get(vipKey(k))
	if !ok {
		svc = maps.Service{VIPKey: vipKey(k)}
	}
	svc.Backends = backends
	return other.Upsert(svc)
}
