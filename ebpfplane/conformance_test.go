package ebpfplane_test

import (
	"reflect"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/bpf"
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
		Tables: tables(t),
	}
}

// tables are the maps the LB's write path writes, each of which a
// tenant's Services can fill: every one the LB holds in memory.
func tables(t *testing.T) []dataplanetest.Table {
	var out []dataplanetest.Table
	for _, m := range maps.InMemoryMaps {
		out = append(out, dataplanetest.Table{Name: m, WithRoom: func(room int) dataplanetest.Backend {
			return conformanceBackend(t, maps.NewInMemorySized(map[string]int{m: room}))
		}})
	}
	return out
}

// notFilledByServices are the maps of bpf.KprMaps that are no table of
// the conformance suite, and why: the maps the programs write themselves
// (LRU maps, which evict rather than fill, and counters), and the ones
// no Service's write fills. A map added to bpf/maps.h fails
// TestConformanceWalksEveryMapServicesFill until it is in one list or
// the other.
var notFilledByServices = map[string]string{
	bpf.KprMapKprAffinity:       "LRU map the socket programs write per client; evicts the oldest when full",
	bpf.KprMapKprConntrack:      "LRU map the tc programs write per flow; evicts the oldest when full",
	bpf.KprMapKprCtNew:          "LRU map the tc programs write per flow until it shows traffic both ways; evicts the oldest when full",
	bpf.KprMapKprFrags:          "LRU map the tc programs write per fragmented datagram; evicts the oldest when full",
	bpf.KprMapKprSockRev:        "LRU map the socket programs write per socket; evicts the oldest when full",
	bpf.KprMapKprTcAffinity:     "LRU map the tc programs write per client; evicts the oldest when full",
	bpf.KprMapKprSnatClaims:     "the tc programs' claims on SNAT ports being taken over, each deleted a few instructions after it is made",
	bpf.KprMapKprSockStats:      "array of counters, one per hook",
	bpf.KprMapKprTcStats:        "per-CPU array of counters, one entry",
	bpf.KprMapKprNodeSeed:       "one entry, the node's flow hash secret, written by the loader",
	bpf.KprMapKprTraceFrontends: "written by `kpr trace` sessions, not by Services",
	bpf.KprMapKprTraceOn:        "written by `kpr trace` sessions, not by Services",
	bpf.KprMapKprTraceRings:     "written by `kpr trace` sessions, not by Services",
	bpf.KprMapKprSockBypass:     "one entry per bypassed pod (--socket-lb per-pod), written by package socketlb from the node's Pods, not by Services",
	// The Maglev tables are written with each change, one per frontend
	// and scope, keyed by the frontend's reverse-NAT id: the loader sizes
	// kpr_maglev at maps.MaglevEntriesPerRevNat entries per entry of
	// kpr_rev_nat (maps.MaglevMaxEntries), so a Service that would
	// overfill it is refused by kpr_rev_nat first, which is a table of
	// the suite. Writing them needs the kernel's maps of maps, which the
	// in-memory LB does not have: TestMaglevTablesFitEveryFrontendRevNatAdmits
	// fills a real one.
	bpf.KprMapKprMaglev: "sized from kpr_rev_nat (two entries per reverse-NAT id, one per scope): " +
		"a Service is refused by kpr_rev_nat before its tables could lack room",
}

// The conformance suite fills every map of bpf.KprMaps that Services fill,
// so a new map cannot miss the per-Service refusal: each map is a table
// of the suite or is in notFilledByServices, never both.
func TestConformanceWalksEveryMapServicesFill(t *testing.T) {
	declared := map[string]bool{}
	for _, tb := range tables(t) {
		declared[tb.Name] = true
	}
	typ := reflect.TypeOf(bpf.KprMaps{})
	seen := map[string]bool{}
	for i := range typ.NumField() {
		m := typ.Field(i).Tag.Get("ebpf")
		seen[m] = true
		_, exempt := notFilledByServices[m]
		switch {
		case declared[m] && exempt:
			t.Errorf("%s is both a table of the suite and in notFilledByServices", m)
		case !declared[m] && !exempt:
			t.Errorf("%s is in bpf.KprMaps but neither a table of the conformance suite (maps.InMemoryMaps) nor in notFilledByServices: "+
				"if Services fill it, the Plane must refuse the one that overfills it", m)
		}
	}
	for m := range notFilledByServices {
		if !seen[m] {
			t.Errorf("notFilledByServices names %s, which bpf.KprMaps does not have", m)
		}
	}
	for m := range declared {
		if !seen[m] {
			t.Errorf("the suite's table %s is no map of bpf.KprMaps", m)
		}
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
