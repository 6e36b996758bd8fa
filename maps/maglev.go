package maps

import (
	"errors"
	"fmt"
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
type Maglev struct {
	lb    *LB
	outer *ebpf.Map
	size  uint32
	seed  uint64
	// held is what kpr_maglev holds for each frontend, as this Maglev
	// wrote it; tables are the arrays those entries point at, by content.
	held   map[VIPKey]heldTable
	tables map[string]*maglevTable
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

// NewMaglev returns the writer of outer (kpr_maglev) for tables of size
// slots and the cluster's seed, which must be the tc programs'
// maglev_table_size and maglev_seed (loader.TCOptions), and makes lb
// write the tables of the frontends it writes from now on. It trusts no
// table it finds: the first write of a frontend replaces its table, with
// the same content where nothing changed, and SyncAll writes every
// frontend's and removes the tables of frontends the LB no longer has.
func NewMaglev(lb *LB, outer *ebpf.Map, size uint32, seed uint64) (*Maglev, error) {
	if err := maglev.ValidateTableSize(size); err != nil {
		return nil, err
	}
	mg := &Maglev{lb: lb, outer: outer, size: size, seed: seed,
		held: map[VIPKey]heldTable{}, tables: map[string]*maglevTable{}}
	lb.maglev = mg
	return mg, nil
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
		if _, ok := mg.want(mg.lb.svcs[k]); !ok {
			errs = append(errs, mg.drop(k))
			continue
		}
		wants = append(wants, k)
	}
	for _, k := range wants {
		errs = append(errs, mg.syncTo(k, mg.lb.svcs[k]))
	}
	return errors.Join(errs...)
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
		return mg.drop(k)
	}
	w.key = bpf.KprMaglevKey{RevNatId: st.revNat, Scope: uint8(k.Scope)}
	return mg.put(k, w.key, w.ids, w.addr)
}

// drop removes the frontend's table, if it has one.
func (mg *Maglev) drop(vip VIPKey) error {
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
			return errors.Join(err, mg.drop(vip))
		}
		mg.tables[sig] = t
	}
	if err := mg.outer.Put(key, t.m); err != nil {
		if t.refs == 0 {
			mg.unref(t)
		}
		return fmt.Errorf("publish the Maglev table of %s (%w); its new flows are picked at random until a retry: "+
			"if kpr_maglev is full, fewer Services can use --lb-algorithm maglev", vip.VIP, err)
	}
	t.refs++
	if had {
		if old.key != key {
			if err := mg.outer.Delete(old.key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete the old Maglev table entry of %s: %w", vip.VIP, err)
			}
		}
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
// kpr_maglev this Maglev did not write: tables of frontends deleted while
// kpr was down, or of a kpr that used other backends. An entry removed
// behind kpr's back is written again.
func (mg *Maglev) SyncAll() error {
	present := map[bpf.KprMaglevKey]bool{}
	var k bpf.KprMaglevKey
	var id uint32
	it := mg.outer.Iterate()
	for it.Next(&k, &id) {
		present[k] = true
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read BPF map %s: %w", bpf.KprMapKprMaglev, err)
	}
	for vip, h := range mg.held {
		if !present[h.key] {
			delete(mg.held, vip)
			mg.unref(h.table)
		}
	}
	err := mg.sync(mg.lb.Keys()...)
	wrote := map[bpf.KprMaglevKey]bool{}
	for _, h := range mg.held {
		wrote[h.key] = true
	}
	var errs []error
	for k := range present {
		if wrote[k] {
			continue
		}
		if err := mg.outer.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete a stale Maglev table: %w", err))
		}
	}
	return errors.Join(append(errs, err)...)
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
