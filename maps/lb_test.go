package maps

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

type fakeMaps struct {
	t             testing.TB
	services      *memTable[bpf.KprSvcKey, bpf.KprSvcValue]
	backends      *memTable[uint32, bpf.KprBackend]
	revNat        *memTable[uint32, bpf.KprRevNatValue]
	affinityMatch *memTable[bpf.KprAffinityMatchKey, uint8]
}

func newFakeMaps(t testing.TB, svcMax, beMax, revMax int) *fakeMaps {
	f := &fakeMaps{
		t:             t,
		services:      newMemTable[bpf.KprSvcKey, bpf.KprSvcValue](svcMax),
		backends:      newMemTable[uint32, bpf.KprBackend](beMax),
		revNat:        newMemTable[uint32, bpf.KprRevNatValue](revMax),
		affinityMatch: newMemTable[bpf.KprAffinityMatchKey, uint8](svcMax),
	}
	f.services.check = f.checkLookupSafe
	f.backends.check = f.checkLookupSafe
	f.revNat.check = f.checkLookupSafe
	return f
}

// writable lists every table, for injecting failures into all of them.
func (f *fakeMaps) writable() []interface{ setFail(int, error) } {
	return []interface{ setFail(int, error) }{f.services, f.backends, f.revNat, f.affinityMatch}
}

// wantMatches is the affinity match set the service map calls for: every
// backend of every master with affinity on, in its scope.
func (f *fakeMaps) wantMatches() map[bpf.KprAffinityMatchKey]uint8 {
	want := map[bpf.KprAffinityMatchKey]uint8{}
	for k, v := range f.services.data {
		if k.Slot != 0 || v.AffinityTimeout == 0 {
			continue
		}
		for s := 1; s <= int(v.Count); s++ {
			sk := k
			sk.Slot = uint16(s)
			want[bpf.KprAffinityMatchKey{BackendId: f.services.data[sk].BackendId, RevNatId: v.RevNatId, Scope: k.Scope}] = 0
		}
	}
	return want
}

// checkMatches fails unless the affinity match map holds exactly what the
// service map calls for: a stale entry would let a client stick to a
// backend its Service no longer has.
func (f *fakeMaps) checkMatches() {
	f.t.Helper()
	if want := f.wantMatches(); !reflect.DeepEqual(want, f.affinityMatch.data) {
		f.t.Fatalf("affinity matches = %v, want %v", f.affinityMatch.data, want)
	}
}

// checkLookupSafe is what a BPF program relies on: every master's slots
// exist, every slot's backend exists, and the reverse-NAT entry exists.
func (f *fakeMaps) checkLookupSafe() {
	f.t.Helper()
	for k, v := range f.services.data {
		if k.Slot != 0 {
			continue
		}
		if _, ok := f.revNat.data[v.RevNatId]; !ok {
			f.t.Fatalf("master %+v points at missing reverse-NAT entry %d", k, v.RevNatId)
		}
		for s := 1; s <= int(v.Count); s++ {
			sk := k
			sk.Slot = uint16(s)
			slot, ok := f.services.data[sk]
			if !ok {
				f.t.Fatalf("master %+v (count %d) points at missing slot %d", k, v.Count, s)
			}
			if _, ok := f.backends.data[slot.BackendId]; !ok {
				f.t.Fatalf("slot %d of %+v points at missing backend %d", s, k, slot.BackendId)
			}
		}
	}
}

func (f *fakeMaps) lb() *LB {
	f.t.Helper()
	lb, err := newLB(tables{f.services, f.backends, f.revNat, f.affinityMatch}, newMemTable[bpf.KprSrcRangeKey, uint8](16), false)
	if err != nil {
		f.t.Fatal(err)
	}
	return lb
}

type snapshot struct {
	services      map[bpf.KprSvcKey]bpf.KprSvcValue
	backends      map[uint32]bpf.KprBackend
	revNat        map[uint32]bpf.KprRevNatValue
	affinityMatch map[bpf.KprAffinityMatchKey]uint8
}

func (f *fakeMaps) snapshot() snapshot {
	return snapshot{maps.Clone(f.services.data), maps.Clone(f.backends.data), maps.Clone(f.revNat.data),
		maps.Clone(f.affinityMatch.data)}
}

func svcFor(vip string, port uint16, backends ...string) Service {
	s := Service{VIPKey: VIPKey{VIP: VIP{Addr: netip.MustParseAddr(vip), Port: port, Proto: dataplane.TCP}}}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		s.Backends = append(s.Backends, dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()})
	}
	return s
}

func TestUpsertGrowShrinkDeleteKeepsLookupsSafe(t *testing.T) {
	f := newFakeMaps(t, 1000, 1000, 1000)
	lb := f.lb()
	steps := []Service{
		svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080"),
		svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080", "10.244.0.5:8080"),
		svcFor("10.96.0.1", 80, "10.244.0.5:8080"),
		svcFor("10.96.0.1", 80),
		svcFor("10.96.0.1", 80, "10.244.0.9:8080"),
	}
	for i, s := range steps {
		if err := lb.Upsert(s); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got, ok := lb.Get(s.VIPKey)
		if !ok || !reflect.DeepEqual(got.Backends, s.Backends) {
			t.Fatalf("step %d: maps hold %+v, want %+v", i, got.Backends, s.Backends)
		}
		if len(f.backends.data) != len(s.Backends) {
			t.Fatalf("step %d: %d backends in the map, want %d (orphans must go)", i, len(f.backends.data), len(s.Backends))
		}
	}
	if err := lb.Delete(steps[0].VIPKey); err != nil {
		t.Fatal(err)
	}
	if n := len(f.services.data) + len(f.backends.data) + len(f.revNat.data); n != 0 {
		t.Fatalf("%d entries left after deleting the only service", n)
	}
}

func TestSharedBackendsAndRevNatAreRefcounted(t *testing.T) {
	f := newFakeMaps(t, 1000, 1000, 1000)
	lb := f.lb()
	a := svcFor("10.96.0.1", 80, "10.244.0.2:8080")
	b := svcFor("10.96.0.2", 80, "10.244.0.2:8080")
	ext := a
	ext.Scope = ScopeExternal
	if err := lb.Upsert(a, b, ext); err != nil {
		t.Fatal(err)
	}
	if len(f.backends.data) != 1 || len(f.revNat.data) != 2 {
		t.Fatalf("want 1 shared backend and 2 reverse-NAT entries, got %d and %d", len(f.backends.data), len(f.revNat.data))
	}
	if err := lb.Delete(a.VIPKey); err != nil {
		t.Fatal(err)
	}
	if len(f.backends.data) != 1 || len(f.revNat.data) != 2 {
		t.Fatal("deleting one user removed a shared backend or reverse-NAT entry")
	}
	if err := lb.Delete(b.VIPKey, ext.VIPKey); err != nil {
		t.Fatal(err)
	}
	if len(f.backends.data)+len(f.revNat.data)+len(f.services.data) != 0 {
		t.Fatal("entries left after the last users were deleted")
	}
}

func TestMapFullLeavesServiceFullyOld(t *testing.T) {
	// Room for one service with 2 backends (3 entries) plus one more entry.
	f := newFakeMaps(t, 4, 100, 100)
	lb := f.lb()
	old := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080")
	if err := lb.Upsert(old); err != nil {
		t.Fatal(err)
	}
	before := f.snapshot()
	grown := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080", "10.244.0.5:8080")
	err := lb.Upsert(grown)
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("want ErrMapFull, got %v", err)
	}
	if !reflect.DeepEqual(before, f.snapshot()) {
		t.Fatal("a refused upsert changed the maps")
	}
	if got, _ := lb.Get(old.VIPKey); !reflect.DeepEqual(got.Backends, old.Backends) {
		t.Fatalf("in-memory view changed to %v", got.Backends)
	}
	// A batch where only part fits applies what fits and names the rest.
	small := svcFor("10.96.0.2", 80)
	err = lb.Upsert(grown, small)
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("want ErrMapFull for the batch, got %v", err)
	}
	if _, ok := lb.Get(small.VIPKey); !ok {
		t.Fatal("the service that fits was not applied")
	}
}

func TestFailedWriteIsRolledBack(t *testing.T) {
	for failAt := 1; failAt <= 8; failAt++ {
		t.Run(fmt.Sprint("fail at write ", failAt), func(t *testing.T) {
			f := newFakeMaps(t, 100, 100, 100)
			lb := f.lb()
			old := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080")
			old.AffinityTimeout = 60
			if err := lb.Upsert(old); err != nil {
				t.Fatal(err)
			}
			before := f.snapshot()
			injected := errors.New("injected write failure")
			for _, tb := range f.writable() {
				tb.setFail(failAt, injected)
			}
			// One backend stays, one leaves, two arrive: every kind of
			// affinity match change is in flight when the write fails.
			newSvc := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.8:8080", "10.244.0.9:8080")
			newSvc.AffinityTimeout = 60
			err := lb.Upsert(newSvc)
			if err == nil {
				// The failure landed after the switch-over: fully new.
				if got, _ := lb.Get(old.VIPKey); !reflect.DeepEqual(got.Backends, newSvc.Backends) {
					t.Fatalf("upsert succeeded but maps hold %v", got.Backends)
				}
				return
			}
			if !errors.Is(err, injected) {
				t.Fatalf("error lost its cause: %v", err)
			}
			for _, tb := range f.writable() {
				tb.setFail(0, nil)
			}
			if !reflect.DeepEqual(before, f.snapshot()) {
				t.Fatalf("maps not rolled back:\nbefore %+v\nafter  %+v", before, f.snapshot())
			}
			// The LB still works and its view matches the maps.
			if err := lb.Upsert(newSvc); err != nil {
				t.Fatal(err)
			}
			if !lb.Matches(newSvc) {
				t.Fatal("retry after rollback did not apply")
			}
		})
	}
}

func TestResyncAdoptsStateAndNeverReusesIDs(t *testing.T) {
	f := newFakeMaps(t, 1000, 1000, 1000)
	lb := f.lb()
	a := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080")
	b := svcFor("fd00:96::1", 53, "[fd00:244::2]:5353")
	b.Proto = dataplane.UDP
	b.AffinityTimeout = 30
	b.Kind = dataplane.NodePort
	if err := lb.Upsert(a, b); err != nil {
		t.Fatal(err)
	}
	restarted := f.lb()
	if !reflect.DeepEqual(lb.List(), restarted.List()) {
		t.Fatalf("restart view differs:\n%+v\n%+v", lb.List(), restarted.List())
	}
	if !restarted.Matches(a) || !restarted.Matches(b) {
		t.Fatal("restarted LB does not recognise what it adopted")
	}
	usedIDs := maps.Clone(f.backends.data)
	c := svcFor("10.96.0.3", 80, "10.244.0.4:8080")
	if err := restarted.Upsert(c); err != nil {
		t.Fatal(err)
	}
	for id := range f.backends.data {
		if old, ok := usedIDs[id]; ok && old != f.backends.data[id] {
			t.Fatalf("backend id %d was reused", id)
		}
	}
}

func TestResyncRepairsDriftAndRemovesGarbage(t *testing.T) {
	f := newFakeMaps(t, 1000, 1000, 1000)
	lb := f.lb()
	a := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080")
	if err := lb.Upsert(a); err != nil {
		t.Fatal(err)
	}
	// Someone deletes a slot by hand and leaves an orphan backend behind.
	// Lookups of this service are broken until the repair, so stop checking.
	f.services.check, f.backends.check, f.revNat.check = nil, nil, nil
	slot := a.bpfKey(2)
	delete(f.services.data, slot)
	f.backends.data[999] = bpf.KprBackend{Port: 1}
	if err := lb.Resync(); err != nil {
		t.Fatal(err)
	}
	if lb.Matches(a) {
		t.Fatal("drift not detected")
	}
	if _, ok := f.backends.data[999]; ok {
		t.Fatal("orphan backend not removed")
	}
	if err := lb.Upsert(a); err != nil {
		t.Fatal(err)
	}
	if !lb.Matches(a) {
		t.Fatal("upsert did not repair the service")
	}
	f.checkLookupSafe()
}

func TestRandomChangesKeepLookupsSafe(t *testing.T) {
	f := newFakeMaps(t, 100000, 100000, 100000)
	lb := f.lb()
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[VIPKey]Service{}
	for i := 0; i < 2000; i++ {
		vip := netip.AddrFrom4([4]byte{10, 96, 0, byte(rng.IntN(20))})
		key := VIPKey{VIP: VIP{Addr: vip, Port: 80, Proto: dataplane.TCP}, Scope: Scope(rng.IntN(2))}
		if rng.IntN(4) == 0 {
			if err := lb.Delete(key); err != nil {
				t.Fatal(err)
			}
			delete(want, key)
			continue
		}
		svc := Service{VIPKey: key, AffinityTimeout: uint32(rng.IntN(2))}
		for n := rng.IntN(6); n > 0; n-- {
			svc.Backends = append(svc.Backends, dataplane.Backend{
				Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(rng.IntN(10))}), Port: 8080})
		}
		if err := lb.Upsert(svc); err != nil {
			t.Fatal(err)
		}
		want[key] = svc
		f.checkMatches()
	}
	if len(lb.List()) != len(want) {
		t.Fatalf("%d services in maps, want %d", len(lb.List()), len(want))
	}
	for _, svc := range want {
		if !lb.Matches(svc) {
			t.Fatalf("maps differ for %v", svc.VIPKey)
		}
	}
	restarted := f.lb()
	if !reflect.DeepEqual(lb.List(), restarted.List()) {
		t.Fatal("resync view differs after random changes")
	}
	for _, u := range restarted.Usage() {
		in := map[string]int{bpf.KprMapKprServices: len(f.services.data), bpf.KprMapKprBackends: len(f.backends.data),
			bpf.KprMapKprRevNat: len(f.revNat.data), bpf.KprMapKprAffinityMatch: len(f.affinityMatch.data)}[u.Map]
		if u.Entries != in || u.MaxEntries != 100000 {
			t.Errorf("usage of %s = %d of %d, maps hold %d of 100000", u.Map, u.Entries, u.MaxEntries, in)
		}
	}
}

func TestInvalidServicesAreRefusedWithoutWriting(t *testing.T) {
	f := newFakeMaps(t, 100, 100, 100)
	lb := f.lb()
	mixed := svcFor("10.96.0.1", 80, "[fd00::1]:80")
	sctp := svcFor("10.96.0.2", 80)
	sctp.Proto = dataplane.SCTP
	good := svcFor("10.96.0.3", 80, "10.244.0.2:80")
	// The maps hold no zone, so a zoned backend would come back as
	// another one after a restart.
	zoned := svcFor("fd00::10", 80, "[fe80::1%eth0]:80")
	// kpr_maglev has room for two scopes a frontend.
	scoped := svcFor("10.96.0.4", 80, "10.244.0.2:80")
	scoped.Scope = ScopeExternal + 1
	err := lb.Upsert(mixed, sctp, good, zoned, scoped)
	if err == nil {
		t.Fatal("invalid services accepted")
	}
	if _, ok := lb.Get(mixed.VIPKey); ok {
		t.Fatal("mixed-family service written")
	}
	if _, ok := lb.Get(zoned.VIPKey); ok {
		t.Fatal("service with a zoned backend written")
	}
	if _, ok := lb.Get(scoped.VIPKey); ok {
		t.Fatal("service of a third scope written")
	}
	if !lb.Matches(good) {
		t.Fatal("a valid service in the same batch was not written")
	}
}

func TestInSyncNoticesEveryKindOfDrift(t *testing.T) {
	setup := func(t *testing.T) (*fakeMaps, *LB, Service) {
		f := newFakeMaps(t, 1000, 1000, 1000)
		f.services.check, f.backends.check, f.revNat.check = nil, nil, nil
		lb := f.lb()
		a := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080")
		a.AffinityTimeout = 10
		if err := lb.Upsert(a); err != nil {
			t.Fatal(err)
		}
		if ok, err := lb.InSync(); !ok || err != nil {
			t.Fatalf("fresh LB not in sync: %v", err)
		}
		return f, lb, a
	}
	for name, drift := range driftKinds {
		t.Run(name, func(t *testing.T) {
			f, lb, a := setup(t)
			drift(f, a)
			if ok, _ := lb.InSync(); ok {
				t.Fatal("drift not noticed")
			}
		})
	}
}

// A client with affinity must not stick to a backend its Service dropped,
// even while that backend lives on for another Service: the match map, not
// the backend map, says who still serves.
func TestAffinityMatchesFollowTheBackendSet(t *testing.T) {
	f := newFakeMaps(t, 1000, 1000, 1000)
	lb := f.lb()
	sticky := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080")
	sticky.AffinityTimeout = 10800
	other := svcFor("10.96.0.2", 80, "10.244.0.4:8080")
	if err := lb.Upsert(sticky, other); err != nil {
		t.Fatal(err)
	}
	f.checkMatches()
	if len(f.affinityMatch.data) != 3 {
		t.Fatalf("%d affinity matches for 3 backends", len(f.affinityMatch.data))
	}

	sticky.Backends = sticky.Backends[:2] // 10.244.0.4 leaves, but other keeps it
	if err := lb.Upsert(sticky); err != nil {
		t.Fatal(err)
	}
	f.checkMatches()
	if len(f.affinityMatch.data) != 2 {
		t.Fatalf("the leaving backend kept its affinity match: %v", f.affinityMatch.data)
	}

	// Matches survive a restart, and a restart repairs lost ones.
	clear(f.affinityMatch.data)
	if _, err := newLB(tables{f.services, f.backends, f.revNat, f.affinityMatch}, newMemTable[bpf.KprSrcRangeKey, uint8](16), false); err != nil {
		t.Fatal(err)
	}
	f.checkMatches()

	sticky.AffinityTimeout = 0
	if err := lb.Upsert(sticky); err != nil {
		t.Fatal(err)
	}
	if len(f.affinityMatch.data) != 0 {
		t.Fatalf("affinity off, yet matches remain: %v", f.affinityMatch.data)
	}
	sticky.AffinityTimeout = 60
	if err := lb.Upsert(sticky); err != nil {
		t.Fatal(err)
	}
	if err := lb.Delete(sticky.VIPKey); err != nil {
		t.Fatal(err)
	}
	if len(f.affinityMatch.data) != 0 {
		t.Fatalf("service deleted, yet matches remain: %v", f.affinityMatch.data)
	}
}

// A reconcile of a whole cluster is written in chunks; every Service lands.
func TestLargeUpsertIsWrittenWhole(t *testing.T) {
	f := newFakeMaps(t, 100000, 100000, 100000)
	// The per-write lookup check is quadratic; other tests cover the order.
	f.services.check, f.backends.check, f.revNat.check = nil, nil, nil
	lb := f.lb()
	var svcs []Service
	for i := 0; i < 3*maxServicesPerCommit+7; i++ {
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		svcs = append(svcs, svcFor(vip.String(), 80, "10.244.0.2:8080", fmt.Sprintf("10.244.1.%d:8080", i%250)))
	}
	if err := lb.Upsert(svcs...); err != nil {
		t.Fatal(err)
	}
	for _, svc := range svcs {
		if !lb.Matches(svc) {
			t.Fatalf("%s missing after a chunked upsert", svc.VIP)
		}
	}
	if entries := lb.Usage()[0].Entries; entries != len(f.services.data) || entries != 3*len(svcs) {
		t.Fatalf("%d service entries accounted, %d in the map, want %d", entries, len(f.services.data), 3*len(svcs))
	}
}
