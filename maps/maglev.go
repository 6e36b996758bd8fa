package maps

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/maps/maglev"
)

// Maglev writes the tc programs' Maglev tables (kpr_maglev, bpf/maps.h)
// for `kpr run --lb-algorithm maglev`: one per frontend and scope that
// traffic from outside reaches (every kind but ClusterIP), built from the
// backends the LB holds for it. A table changes as a whole: a new array
// map is filled, then published by one update of the frontend's entry (see
// the comment at kpr_maglev). Frontends whose backends are the same share
// one array, as the NodePort of every node address and the LoadBalancer IP
// of one Service do.
//
// The LB writes the tables as part of each change, in the order write.go
// promises; SyncAll repairs them. Like the LB, it is not safe for
// concurrent use.
//
// Every entry of kpr_maglev is keyed by a reverse-NAT id the LB holds for
// a frontend, and a scope: at most MaglevEntriesPerRevNat per id. A table
// is published after its reverse-NAT entry is written and removed before
// the id is freed; a frontend whose id changes loses its old entry before
// it gets the new one; and NewMaglev removes the entries of a kpr before
// it that no frontend of the LB has. So kpr_maglev, sized by
// MaglevMaxEntries from kpr_rev_nat, cannot fill before kpr_rev_nat
// refuses a Service.
type Maglev struct {
	lb    *LB
	outer *ebpf.Map
	size  uint32
	seed  uint64
	// held is what kpr_maglev holds for each frontend, as this Maglev
	// wrote it; tables are the arrays those entries point at, by content.
	held   map[VIPKey]heldTable
	tables map[string]*maglevTable
	// found are the entries a kpr before this one wrote for frontends
	// the LB still has, until this Maglev replaces or removes them.
	found map[bpf.KprMaglevKey]bool
	// OnError, when set, hears of a table the LB's write could not bring
	// up to date: its frontend is still served, its new flows picked at
	// random until a SyncAll writes it.
	OnError func(error)
	// OnSparse, when set, hears of a table with fewer than
	// maglev.SlotsPerBackend slots per backend: still the same on every
	// node, but less even, and a change moves more flows than it must.
	OnSparse func(key VIPKey, backends int, size uint32)
}

type heldTable struct {
	key   bpf.KprMaglevKey
	table *maglevTable
}

// maglevTable is one array map of backend ids, and how many frontends
// point at it.
type maglevTable struct {
	m    *ebpf.Map
	sig  string
	refs int
}

// MaglevEntriesPerRevNat is how many entries of kpr_maglev one
// reverse-NAT id keys at most: one per scope of its frontend
// (ScopeInternal and ScopeExternal; the LB refuses any other).
const MaglevEntriesPerRevNat = 2

// MaglevMaxEntries is the size kpr_maglev needs beside a kpr_rev_nat of
// revNat entries (--map-size-revnat): room for a table of every frontend
// and scope the LB can admit. The loader sizes kpr_maglev so; a Service
// with one frontend more is refused by kpr_rev_nat (MapFullError) before
// any frontend could lack room for its table.
func MaglevMaxEntries(revNat uint32) uint32 {
	return uint32(min(uint64(revNat)*MaglevEntriesPerRevNat, math.MaxUint32))
}

// NewMaglev returns the writer of outer (kpr_maglev) for tables of size
// slots and the cluster's seed, which must be the tc programs'
// maglev_table_size and maglev_seed (loader.TCOptions), and makes lb
// write the tables of the frontends it writes from now on. It trusts no
// table it finds: the first write of a frontend replaces its table, with
// the same content where nothing changed, and SyncAll writes every
// frontend's and removes the tables of frontends the LB no longer has.
// The tables of frontends the LB does not have, or that call for none,
// it removes at once, so that they take no room from the tables written
// before the next SyncAll.
func NewMaglev(lb *LB, outer *ebpf.Map, size uint32, seed uint64) (*Maglev, error) {
	if err := maglev.ValidateTableSize(size); err != nil {
		return nil, err
	}
	mg := &Maglev{lb: lb, outer: outer, size: size, seed: seed,
		held: map[VIPKey]heldTable{}, tables: map[string]*maglevTable{}, found: map[bpf.KprMaglevKey]bool{}}
	present, err := mg.present()
	if err != nil {
		return nil, err
	}
	wanted := mg.wantedKeys(lb.Keys())
	for k := range present {
		if wanted[k] {
			mg.found[k] = true
		} else if err := mg.remove(k); err != nil {
			return nil, err
		}
	}
	lb.maglev = mg
	return mg, nil
}

// present reads the keys kpr_maglev holds.
func (mg *Maglev) present() (map[bpf.KprMaglevKey]bool, error) {
	present := map[bpf.KprMaglevKey]bool{}
	var k bpf.KprMaglevKey
	var id uint32
	it := mg.outer.Iterate()
	for it.Next(&k, &id) {
		present[k] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read BPF map %s: %w", bpf.KprMapKprMaglev, err)
	}
	return present, nil
}

// wantedKeys are the entries of kpr_maglev the LB's state of keys calls
// for.
func (mg *Maglev) wantedKeys(keys []VIPKey) map[bpf.KprMaglevKey]bool {
	wanted := map[bpf.KprMaglevKey]bool{}
	for _, k := range keys {
		st := mg.lb.svcs[k]
		if _, ok := mg.want(st); ok {
			wanted[bpf.KprMaglevKey{RevNatId: st.revNat, Scope: uint8(k.Scope)}] = true
		}
	}
	return wanted
}

// remove deletes the entry k, which this Maglev does not hold.
func (mg *Maglev) remove(k bpf.KprMaglevKey) error {
	if err := mg.outer.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete a stale Maglev table: %w", err)
	}
	delete(mg.found, k)
	return nil
}

// report passes a failed table write to OnError.
func (mg *Maglev) report(err error) {
	if err != nil && mg.OnError != nil {
		mg.OnError(err)
	}
}

// Close drops this process's handles on the tables; kpr_maglev keeps them.
// The LB writes no tables from then on.
func (mg *Maglev) Close() error {
	if mg.lb.maglev == mg {
		mg.lb.maglev = nil
	}
	var errs []error
	for _, t := range mg.tables {
		errs = append(errs, t.m.Close())
	}
	mg.tables = map[string]*maglevTable{}
	mg.held = map[VIPKey]heldTable{}
	return errors.Join(errs...)
}

// sync brings the tables of keys to what the LB holds for them: a table
// for every one the LB has (unless its kind is ClusterIP or it has no
// backend), none for the others. The LB's writes keep the tables in step
// (write.go); this is for SyncAll's repair.
func (mg *Maglev) sync(keys ...VIPKey) error {
	// Deletes first: a reverse-NAT id a dropped frontend had may be a new
	// frontend's by now, and its new table must not be deleted after it
	// was written.
	var errs []error
	var wants []VIPKey
	for _, k := range keys {
		k.Addr = k.Addr.Unmap()
		st := mg.lb.svcs[k]
		if _, ok := mg.want(st); !ok {
			errs = append(errs, mg.drop(k, revNatOf(st)))
			continue
		}
		wants = append(wants, k)
	}
	for _, k := range wants {
		errs = append(errs, mg.syncTo(k, mg.lb.svcs[k]))
	}
	return errors.Join(errs...)
}

// revNatOf is the reverse-NAT id of st; 0 for none.
func revNatOf(st *svcState) uint32 {
	if st == nil {
		return 0
	}
	return st.revNat
}

// wantTable is the table a frontend's state calls for: the backend ids of
// its slots, once each, and their addresses.
type wantTable struct {
	key  bpf.KprMaglevKey
	ids  []uint32
	addr []backendAddr
}

// want returns the table st calls for; none (false) for a frontend that is
// gone, a ClusterIP (no traffic from outside reaches it), or one without
// backends.
func (mg *Maglev) want(st *svcState) (wantTable, bool) {
	if st == nil || st.revNat == 0 || st.kind == uint8(bpf.KprSvcKindSVC_KIND_CLUSTER_IP) {
		return wantTable{}, false
	}
	var w wantTable
	seen := map[uint32]bool{}
	for _, id := range st.slots {
		e, ok := mg.lb.backendOf[id]
		if id == 0 || !ok || seen[id] {
			continue
		}
		seen[id] = true
		w.ids = append(w.ids, id)
		w.addr = append(w.addr, e.addr)
	}
	return w, len(w.ids) > 0
}

// syncTo brings the table of k to what st calls for.
func (mg *Maglev) syncTo(k VIPKey, st *svcState) error {
	w, ok := mg.want(st)
	if !ok {
		return mg.drop(k, revNatOf(st))
	}
	w.key = bpf.KprMaglevKey{RevNatId: st.revNat, Scope: uint8(k.Scope)}
	return mg.put(k, w.key, w.ids, w.addr)
}

// drop removes the frontend's table, if it has one: the one this Maglev
// wrote, and the one a kpr before it left under the frontend's
// reverse-NAT id revNat (0 for none), which would otherwise keep its room
// in kpr_maglev after the id is freed.
func (mg *Maglev) drop(vip VIPKey, revNat uint32) error {
	if revNat != 0 {
		if k := (bpf.KprMaglevKey{RevNatId: revNat, Scope: uint8(vip.Scope)}); mg.found[k] {
			if err := mg.remove(k); err != nil {
				return err
			}
		}
	}
	h, ok := mg.held[vip]
	if !ok {
		return nil
	}
	if err := mg.outer.Delete(h.key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete the Maglev table of %s: %w", vip.VIP, err)
	}
	delete(mg.held, vip)
	mg.unref(h.table)
	return nil
}

// put points the frontend's entry at the table of these backends, built
// and filled first if no other frontend has it.
func (mg *Maglev) put(vip VIPKey, key bpf.KprMaglevKey, ids []uint32, addrs []backendAddr) error {
	sig := tableSig(ids)
	old, had := mg.held[vip]
	if had && old.key == key && old.table.sig == sig {
		return nil
	}
	t := mg.tables[sig]
	if t == nil {
		var err error
		if t, err = mg.build(vip, sig, ids, addrs); err != nil {
			// The table the frontend had names backends it no longer
			// has all of: the backend slots serve it better.
			return errors.Join(err, mg.drop(vip, key.RevNatId))
		}
		mg.tables[sig] = t
	}
	moved := had && old.key != key
	if moved {
		// The frontend's reverse-NAT id changed (the maps were changed
		// behind kpr's back). The old entry goes first, so that one
		// frontend never takes two: lookups by the old id pick at
		// random in the meantime, as they would once the new entry
		// replaced the old.
		if err := mg.outer.Delete(old.key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			if t.refs == 0 {
				mg.unref(t)
			}
			return fmt.Errorf("delete the old Maglev table entry of %s: %w", vip.VIP, err)
		}
		delete(mg.held, vip) // its table's reference goes below, once t is safe
	}
	if err := mg.outer.Put(key, t.m); err != nil {
		if t.refs == 0 {
			mg.unref(t)
		}
		if moved {
			mg.unref(old.table)
		}
		// kpr_maglev has room for a table of every frontend kpr_rev_nat
		// admits (MaglevMaxEntries): kpr's own writes cannot fill it.
		why := "kpr_maglev has room for it (it is sized from --map-size-revnat), so the kernel refused the entry for another reason; " +
			"for ENOMEM, check the node's free memory (and, on kernels before 5.11, the memlock limit of kpr's process)"
		if errors.Is(err, unix.E2BIG) {
			why = "kpr_maglev is full, which kpr's own tables cannot make it (it is sized from --map-size-revnat): " +
				"something outside kpr wrote it; the next reconcile removes the entries no frontend calls for"
		}
		return fmt.Errorf("publish the Maglev table of %s (%w): %s; its new flows are picked at random until the next reconcile retries",
			vip.VIP, err, why)
	}
	delete(mg.found, key)
	t.refs++
	if had {
		mg.unref(old.table)
	}
	mg.held[vip] = heldTable{key: key, table: t}
	return nil
}

// build creates and fills the array for backends ids (addrs their
// addresses), not yet published.
func (mg *Maglev) build(vip VIPKey, sig string, ids []uint32, addrs []backendAddr) (*maglevTable, error) {
	names := make([]string, len(addrs))
	for i, a := range addrs {
		// What every node calls the backend: its address and port, never
		// its node-local id.
		names[i] = netip.AddrPortFrom(a.Addr(), a.port).String()
	}
	slots, err := maglev.Build(names, mg.size, mg.seed)
	if err != nil {
		return nil, fmt.Errorf("Maglev table of %s: %w; its new flows are picked at random", vip.VIP, err)
	}
	if mg.OnSparse != nil && uint64(len(ids))*maglev.SlotsPerBackend > uint64(mg.size) {
		mg.OnSparse(vip, len(ids), mg.size)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "kpr_maglev_tbl", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: mg.size,
		// The flag kpr_maglev's template has: the kernel accepts an inner
		// map only with the template's flags.
		Flags: unix.BPF_F_INNER_MAP,
	})
	if err != nil {
		return nil, fmt.Errorf("create the Maglev table of %s: %w", vip.VIP, err)
	}
	keys := make([]uint32, mg.size)
	values := make([]uint32, mg.size)
	for i, b := range slots {
		keys[i] = uint32(i)
		values[i] = ids[b]
	}
	t := &maglevTable{m: m, sig: sig}
	if err := newBPFTable[uint32, uint32](m).put(keys, values); err != nil {
		m.Close()
		return nil, fmt.Errorf("fill the Maglev table of %s: %w", vip.VIP, err)
	}
	return t, nil
}

// unref drops one frontend's use of t, and this process's handle once no
// frontend uses it (kpr_maglev's entries hold their own references).
func (mg *Maglev) unref(t *maglevTable) {
	t.refs--
	if t.refs > 0 {
		return
	}
	t.m.Close()
	if mg.tables[t.sig] == t {
		delete(mg.tables, t.sig)
	}
}

// tableSig names a table by its content: the set of backend ids. A given
// set always builds the same table, whatever the slot order.
func tableSig(ids []uint32) string {
	sorted := append([]uint32(nil), ids...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	var b strings.Builder
	for _, id := range sorted {
		b.WriteString(strconv.FormatUint(uint64(id), 36))
		b.WriteByte(',')
	}
	return b.String()
}

// SyncAll syncs every frontend the LB has and removes every entry of
// kpr_maglev no frontend calls for: tables of frontends deleted behind
// kpr's back, or of a kpr that used other backends. Those go before any
// table is written, so that the tables written find the room they free.
// An entry removed behind kpr's back is written again.
func (mg *Maglev) SyncAll() error {
	present, err := mg.present()
	if err != nil {
		return err
	}
	keys := mg.lb.Keys()
	wanted := mg.wantedKeys(keys)
	var errs []error
	for k := range present {
		if wanted[k] {
			continue
		}
		if err := mg.remove(k); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(present, k)
	}
	// What is gone from kpr_maglev, by the deletes above or behind kpr's
	// back, this Maglev no longer holds: sync writes it again if wanted.
	for vip, h := range mg.held {
		if !present[h.key] {
			delete(mg.held, vip)
			mg.unref(h.table)
		}
	}
	for k := range mg.found {
		if !present[k] {
			delete(mg.found, k)
		}
	}
	errs = append(errs, mg.sync(keys...))
	// A table found that is still not this Maglev's belongs to a frontend
	// whose write failed just now: it may name backends the frontend no
	// longer has, and the backend slots serve it better.
	wrote := map[bpf.KprMaglevKey]bool{}
	for _, h := range mg.held {
		wrote[h.key] = true
	}
	for k := range present {
		if wanted[k] && !wrote[k] {
			errs = append(errs, mg.remove(k))
		}
	}
	return errors.Join(errs...)
}

// RemoveMaglevTables empties outer (kpr_maglev), for --lb-algorithm
// random: tables a kpr with maglev left behind would otherwise keep
// picking the backends of new flows. It returns how many it removed.
func RemoveMaglevTables(outer *ebpf.Map) (int, error) {
	var keys []bpf.KprMaglevKey
	var k bpf.KprMaglevKey
	var id uint32
	it := outer.Iterate()
	for it.Next(&k, &id) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read BPF map %s: %w", bpf.KprMapKprMaglev, err)
	}
	n := 0
	for _, k := range keys {
		if err := outer.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete from BPF map %s: %w", bpf.KprMapKprMaglev, err)
		}
		n++
	}
	return n, nil
}

// MaglevTable is one frontend's table as kpr_maglev holds it, for
// inspection.
type MaglevTable struct {
	VIPKey
	Size int
	// Shares are the backends and how many slots each has, most first.
	Shares []MaglevShare
}

// MaglevShare is one backend's part of a table. Backend is invalid for
// slots naming a backend id the backend map lacks.
type MaglevShare struct {
	Backend netip.AddrPort
	ID      uint32
	Slots   int
}

// MaglevTables reads every table of outer (kpr_maglev) and counts the
// slots of each backend, resolving frontends and backends through lb.
// Entries whose frontend lb does not know are left out.
func MaglevTables(lb *LB, outer *ebpf.Map) ([]MaglevTable, error) {
	byKey := map[bpf.KprMaglevKey]VIPKey{}
	for vip, st := range lb.svcs {
		if st.revNat != 0 {
			byKey[bpf.KprMaglevKey{RevNatId: st.revNat, Scope: uint8(vip.Scope)}] = vip
		}
	}
	var out []MaglevTable
	var k bpf.KprMaglevKey
	var innerID uint32
	it := outer.Iterate()
	for it.Next(&k, &innerID) {
		vip, ok := byKey[k]
		if !ok {
			continue
		}
		t, err := readShares(lb, ebpf.MapID(innerID))
		if err != nil {
			return out, fmt.Errorf("read the Maglev table of %s: %w", vip.VIP, err)
		}
		t.VIPKey = vip
		out = append(out, t)
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read BPF map %s: %w", bpf.KprMapKprMaglev, err)
	}
	sort.Slice(out, func(i, j int) bool { return keyLess(out[i].VIPKey, out[j].VIPKey) })
	return out, nil
}

func readShares(lb *LB, id ebpf.MapID) (MaglevTable, error) {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return MaglevTable{}, err
	}
	defer m.Close()
	counts := map[uint32]int{}
	size := 0
	err = newBPFTable[uint32, uint32](m).dump(func(_ uint32, backend uint32) {
		counts[backend]++
		size++
	})
	if err != nil {
		return MaglevTable{}, err
	}
	t := MaglevTable{Size: size}
	for bid, n := range counts {
		s := MaglevShare{ID: bid, Slots: n}
		if e, ok := lb.backendOf[bid]; ok {
			s.Backend = netip.AddrPortFrom(e.addr.Addr(), e.addr.port)
		}
		t.Shares = append(t.Shares, s)
	}
	sort.Slice(t.Shares, func(i, j int) bool {
		if t.Shares[i].Slots != t.Shares[j].Slots {
			return t.Shares[i].Slots > t.Shares[j].Slots
		}
		return t.Shares[i].ID < t.Shares[j].ID
	})
	return t, nil
}
