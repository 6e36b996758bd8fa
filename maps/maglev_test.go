package maps

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps/maglev"
)

// maglevMaps are fake service maps beside a real kpr_maglev (tables are
// arrays of maps, which only the kernel has), checked after every single
// write to the fake maps for what write.go promises of the tables.
type maglevMaps struct {
	*fakeMaps
	outer *ebpf.Map
	lb    *LB
	mg    *Maglev
	// failed are the table writes Maglev.OnError heard of.
	failed []error
}

func newMaglevMaps(t *testing.T) *maglevMaps { return newMaglevMapsSized(t, 64) }

// newMaglevMapsSized is newMaglevMaps with a kpr_maglev of entries.
func newMaglevMapsSized(t *testing.T, entries uint32) *maglevMaps {
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[bpf.KprMapKprMaglev].Copy()
	ms.Pinning = ebpf.PinNone
	ms.MaxEntries = entries
	outer, err := ebpf.NewMap(ms)
	if err != nil {
		t.Skipf("create %s (needs root, or CAP_BPF): %v", bpf.KprMapKprMaglev, err)
	}
	t.Cleanup(func() { outer.Close() })
	f := &maglevMaps{fakeMaps: newFakeMaps(t, 100, 100, 100), outer: outer}
	check := func() { f.checkLookupSafe(); f.checkTables() }
	f.services.check, f.backends.check, f.revNat.check = check, check, check
	f.lb = f.fakeMaps.lb()
	if f.mg, err = NewMaglev(f.lb, outer, maglev.MinTableSize, 0); err != nil {
		t.Fatal(err)
	}
	f.mg.OnError = func(err error) { f.failed = append(f.failed, err) }
	t.Cleanup(func() { f.mg.Close() })
	return f
}

// tables reads kpr_maglev: the backend ids of each entry's table.
func (f *maglevMaps) tables() map[bpf.KprMaglevKey]map[uint32]bool {
	f.t.Helper()
	out := map[bpf.KprMaglevKey]map[uint32]bool{}
	var k bpf.KprMaglevKey
	var id uint32
	it := f.outer.Iterate()
	for it.Next(&k, &id) {
		m, err := ebpf.NewMapFromID(ebpf.MapID(id))
		if err != nil {
			f.t.Fatal(err)
		}
		ids := map[uint32]bool{}
		err = newBPFTable[uint32, uint32](m).dump(func(_ uint32, backend uint32) { ids[backend] = true })
		m.Close()
		if err != nil {
			f.t.Fatal(err)
		}
		out[k] = ids
	}
	if err := it.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// checkTables fails when a master that takes traffic from outside finds no
// table (it was published after the master), when a table names a backend
// the backend map lacks (the backend went before the table that named
// it), or when a table outlives the reverse-NAT id it is keyed by (a
// frontend given the id again would pick by it).
func (f *maglevMaps) checkTables() {
	f.t.Helper()
	tables := f.tables()
	for k, v := range f.services.data {
		if k.Slot != 0 || v.Count == 0 || v.Kind == uint8(bpf.KprSvcKindSVC_KIND_CLUSTER_IP) {
			continue
		}
		if _, ok := tables[bpf.KprMaglevKey{RevNatId: v.RevNatId, Scope: k.Scope}]; !ok {
			f.t.Fatalf("master %s has backends and no Maglev table", vipKeyFromBPF(k))
		}
	}
	for key, ids := range tables {
		if _, ok := f.revNat.data[key.RevNatId]; !ok {
			f.t.Fatalf("a Maglev table is keyed by reverse-NAT id %d, which the reverse-NAT map lacks", key.RevNatId)
		}
		for id := range ids {
			if _, ok := f.backends.data[id]; !ok {
				f.t.Fatalf("the Maglev table of reverse-NAT id %d names backend %d, which the backend map lacks", key.RevNatId, id)
			}
		}
	}
}

func TestMaglevTablesAreWrittenInLookupSafeOrder(t *testing.T) {
	f := newMaglevMaps(t)
	lb, mg := f.lb, f.mg

	web := svcFor("198.51.100.10", 80, "10.244.0.1:8080", "10.244.0.2:8080")
	web.Kind = dataplane.LoadBalancer
	api := svcFor("198.51.100.11", 80, "10.244.0.3:8080")
	api.Kind = dataplane.NodePort
	cluster := svcFor("10.96.0.1", 80, "10.244.0.1:8080")
	steps := []struct {
		desc string
		do   func() error
	}{
		{"new frontends", func() error { return lb.Upsert(web, api, cluster) }},
		{"backends replaced", func() error {
			web.Backends = svcFor("0.0.0.0", 0, "10.244.0.4:8080", "10.244.0.5:8080").Backends
			return lb.Upsert(web)
		}},
		{"backends shrink", func() error { web.Backends = web.Backends[:1]; return lb.Upsert(web) }},
		{"no backends", func() error { api.Backends = nil; return lb.Upsert(api) }},
		{"backends again", func() error {
			api.Backends = svcFor("0.0.0.0", 0, "10.244.0.6:8080").Backends
			return lb.Upsert(api)
		}},
		{"deleted", func() error { return lb.Delete(web.VIPKey) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.desc, err)
		}
		if len(f.failed) > 0 {
			t.Fatalf("%s: %v", s.desc, errors.Join(f.failed...))
		}
		// Exactly the frontends with backends that outside traffic
		// reaches have a table, each of the backends they have now.
		tables := f.tables()
		want := 0
		for _, key := range lb.Keys() {
			st := lb.svcs[key]
			if _, ok := mg.want(st); !ok {
				continue
			}
			want++
			ids := tables[bpf.KprMaglevKey{RevNatId: st.revNat, Scope: uint8(key.Scope)}]
			if len(ids) != len(st.slots) {
				t.Errorf("%s: the table of %s names %d backends, want %d", s.desc, key.VIP, len(ids), len(st.slots))
			}
			for _, id := range st.slots {
				if !ids[id] {
					t.Errorf("%s: the table of %s lacks backend %d", s.desc, key.VIP, id)
				}
			}
		}
		if len(tables) != want {
			t.Errorf("%s: kpr_maglev holds %d tables, want %d", s.desc, len(tables), want)
		}
	}
}

// A change that fails after its tables were published gives the frontend
// back the table of its old backends, before those of the new go.
func TestFailedWriteRestoresMaglevTables(t *testing.T) {
	f := newMaglevMaps(t)
	lb := f.lb
	web := svcFor("198.51.100.10", 80, "10.244.0.1:8080")
	web.Kind = dataplane.LoadBalancer
	if err := lb.Upsert(web); err != nil {
		t.Fatal(err)
	}
	old := lb.svcs[web.VIPKey].slots[0]
	injected := errors.New("injected write failure")
	// The master's write is the fourth: a new backend, two slots, then
	// the master (the reverse-NAT entry is there already).
	f.services.setFail(3, injected)
	web.Backends = svcFor("0.0.0.0", 0, "10.244.0.2:8080", "10.244.0.3:8080").Backends
	if err := lb.Upsert(web); !errors.Is(err, injected) {
		t.Fatalf("Upsert = %v, want the injected failure", err)
	}
	f.services.setFail(0, nil)
	st := lb.svcs[web.VIPKey]
	ids := f.tables()[bpf.KprMaglevKey{RevNatId: st.revNat, Scope: uint8(web.Scope)}]
	if len(ids) != 1 || !ids[old] {
		t.Errorf("after the rollback the table names %v, want the old backend %d alone", ids, old)
	}
	if len(f.failed) > 0 {
		t.Errorf("table writes failed: %v", errors.Join(f.failed...))
	}
}

// innerTable is an array as kpr_maglev takes them, for entries written
// behind the Maglev's back.
func innerTable(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: maglev.MinTableSize, Flags: unix.BPF_F_INNER_MAP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// A new Maglev (a restarted kpr) removes at once the entries of kpr_maglev
// that no frontend of the LB calls for, and keeps those of its frontends
// until it writes them: only those count against the room MaglevMaxEntries
// gives.
func TestNewMaglevRemovesTablesNoFrontendCallsFor(t *testing.T) {
	f := newMaglevMaps(t)
	web := svcFor("198.51.100.10", 80, "10.244.0.1:8080")
	web.Kind = dataplane.LoadBalancer
	cluster := svcFor("10.96.0.1", 80, "10.244.0.1:8080")
	if err := f.lb.Upsert(web, cluster); err != nil {
		t.Fatal(err)
	}
	webKey := bpf.KprMaglevKey{RevNatId: f.lb.svcs[web.VIPKey].revNat, Scope: uint8(web.Scope)}
	before := f.tables()[webKey]
	// Left by a kpr before: a frontend gone since, and a ClusterIP.
	gone := bpf.KprMaglevKey{RevNatId: 999, Scope: uint8(ScopeExternal)}
	clusterKey := bpf.KprMaglevKey{RevNatId: f.lb.svcs[cluster.VIPKey].revNat, Scope: uint8(cluster.Scope)}
	for _, k := range []bpf.KprMaglevKey{gone, clusterKey} {
		if err := f.outer.Put(k, innerTable(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.mg.Close(); err != nil {
		t.Fatal(err)
	}
	lb := f.fakeMaps.lb()
	mg, err := NewMaglev(lb, f.outer, maglev.MinTableSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	tables := f.tables()
	if len(tables) != 1 || len(tables[webKey]) != len(before) {
		t.Errorf("after NewMaglev kpr_maglev holds %v, want only the table of %s", tables, web.VIP)
	}
	// Deleting the frontend removes the table the kpr before wrote.
	if err := lb.Delete(web.VIPKey); err != nil {
		t.Fatal(err)
	}
	if tables := f.tables(); len(tables) != 0 {
		t.Errorf("after the frontend was deleted kpr_maglev holds %v, want nothing", tables)
	}
}

// SyncAll removes the entries no frontend calls for before it writes a
// table, so that one written behind kpr's back takes no room from the
// frontends' tables; and it removes the tables of frontends the LB lost
// when it re-read the maps.
func TestSyncAllMakesRoomBeforeWriting(t *testing.T) {
	f := newMaglevMapsSized(t, 2)
	web := svcFor("198.51.100.10", 80, "10.244.0.1:8080")
	web.Kind = dataplane.LoadBalancer
	if err := f.lb.Upsert(web); err != nil {
		t.Fatal(err)
	}
	webKey := bpf.KprMaglevKey{RevNatId: f.lb.svcs[web.VIPKey].revNat, Scope: uint8(web.Scope)}
	if err := f.outer.Delete(webKey); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{900, 901} {
		if err := f.outer.Put(bpf.KprMaglevKey{RevNatId: id}, innerTable(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.mg.SyncAll(); err != nil {
		t.Fatalf("SyncAll over a full kpr_maglev: %v", err)
	}
	if tables := f.tables(); len(tables) != 1 || tables[webKey] == nil {
		t.Errorf("after SyncAll kpr_maglev holds %v, want the table of %s alone", tables, web.VIP)
	}

	// The master goes behind kpr's back; the LB re-reads the maps.
	f.services.check, f.backends.check, f.revNat.check = nil, nil, nil
	delete(f.services.data, web.bpfKey(0))
	if err := f.lb.Resync(); err != nil {
		t.Fatal(err)
	}
	if err := f.mg.SyncAll(); err != nil {
		t.Fatal(err)
	}
	if tables := f.tables(); len(tables) != 0 {
		t.Errorf("after SyncAll kpr_maglev holds %v for a frontend the LB no longer has, want nothing", tables)
	}
}

// A frontend whose reverse-NAT id changed (its entry in kpr_rev_nat was
// lost behind kpr's back) loses the entry of its old id before it gets
// the new one: it never takes two entries of kpr_maglev.
func TestMovedFrontendNeverTakesTwoEntries(t *testing.T) {
	f := newMaglevMapsSized(t, 2)
	web := svcFor("198.51.100.10", 80, "10.244.0.1:8080")
	web.Kind = dataplane.LoadBalancer
	// api keeps the next id taken, so that web gets another one.
	api := svcFor("198.51.100.11", 80, "10.244.0.2:8080")
	api.Kind = dataplane.LoadBalancer
	if err := f.lb.Upsert(web, api); err != nil {
		t.Fatal(err)
	}
	old := f.lb.svcs[web.VIPKey].revNat
	f.services.check, f.backends.check, f.revNat.check = nil, nil, nil
	delete(f.revNat.data, old)
	if err := f.lb.Resync(); err != nil {
		t.Fatal(err)
	}
	if err := f.lb.Upsert(web); err != nil {
		t.Fatal(err)
	}
	if len(f.failed) > 0 {
		t.Fatalf("table writes failed: %v", errors.Join(f.failed...))
	}
	now := f.lb.svcs[web.VIPKey].revNat
	if now == old {
		t.Fatalf("the frontend kept reverse-NAT id %d: the test checks nothing", old)
	}
	if tables := f.tables(); len(tables) != 2 || tables[bpf.KprMaglevKey{RevNatId: now, Scope: uint8(web.Scope)}] == nil {
		t.Errorf("kpr_maglev holds %v, want the tables of api and of web's id %d", tables, now)
	}
}
