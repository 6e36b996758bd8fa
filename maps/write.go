package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpr-io/kpr/bpf"
)

// This file is the one write path of the maps the programs look Services
// up in, and this comment the one place their order is promised. A change
// is written in seven steps, each safe for a BPF program looking up the
// same Service at the same moment:
//
//  1. new backends, and the source ranges the new masters will ask for,
//     added to what the source-range map holds for their frontends
//  2. backend slots 1..n (new ones, and old ones overwritten in place)
//  3. the reverse-NAT entry
//  4. affinity matches: added for new backends, removed for leaving ones,
//     so no client sticks to a backend once it leaves
//  5. with --lb-algorithm maglev, the frontend's Maglev table for the new
//     backends (a new array, published by one update of kpr_maglev); then
//     the master entry with the new count and flags: from here on lookups
//     see the new Service
//  6. slots past the new count, source ranges no master asks for any
//     more, and the Maglev tables of frontends that no longer have one
//  7. backends no slot points at any more
//
// A master therefore never points at a slot or a backend that does not
// exist yet, and never asks for source ranges the map lacks: a master that
// asks for ranges drops every client outside the ones it finds, so ranges
// missing for a moment would drop clients the Service admits, both before
// and after the change. Between steps 1 and 6 a frontend's ranges are the
// old and new ones together, which admits for a moment a client that only
// the old ranges admitted: a connection the Service allowed until then.
// Steps 1-5 are undone if any of them fails, so a Service is left fully
// old or fully new; the undo, too, restores the masters before it removes
// the ranges they no longer ask for, and gives the frontends back the
// Maglev tables of their old backends before those of the new go. A
// missing affinity match only costs a client its stickiness for one
// connect, never a wrong backend.
//
// A Maglev table names backend ids; the programs fall back to the backend
// slots when it names one the backend map lacks. Published before the
// master, a new frontend's first flows already pick by its table, alike on
// every node; and since backends are deleted only in step 7, after the
// tables that named them were replaced, no table ever names a missing one.
// A table that cannot be written does not fail the change: its frontend is
// served, its new flows picked at random until Maglev.SyncAll writes it.
//
// A delete goes the other way: masters first, so that lookups stop at
// once, then slots, affinity matches, source ranges, Maglev tables,
// reverse-NAT entries and the backends nothing points at. A table goes
// before the reverse-NAT id it is keyed by is freed, so that it never
// serves another frontend given that id, and so that kpr_maglev never
// holds more than MaglevEntriesPerRevNat entries per id the LB holds:
// sized by MaglevMaxEntries, it has room for every frontend kpr_rev_nat
// admits.

var errReadOnly = errors.New("maps opened read-only: only the control plane writes them")

// plan is the change of one VIPKey.
type plan struct {
	svc      Service
	old      *svcState // nil for a new VIPKey
	slots    []uint32  // backend ids for slots 1..n
	revNat   uint32
	kind     uint8    // svc.Kind as the service map stores it
	newRev   bool     // revNat was allocated for this plan
	created  []uint32 // backend ids allocated for this plan
	newCount int      // service map entries this plan adds
}

// Upsert writes the given Services. Each is applied completely or not at
// all. Services that fit are applied even when others are refused; the
// error names every refused one.
func (lb *LB) Upsert(svcs ...Service) error {
	groups := make([][]Service, len(svcs))
	for i := range svcs {
		groups[i] = svcs[i : i+1]
	}
	return errors.Join(lb.UpsertGroups(groups)...)
}

// UpsertGroups writes groups of Services, such as the frontends of one
// Kubernetes ServicePort, each group completely or not at all: a group that
// does not fit is refused whole, so a ServicePort is never served on some
// of its frontends only. Groups that fit are applied even when others are
// refused. errs[i] is group i's error, nil when it was written; a refusal
// for lack of room is a *MapFullError (errors.Is ErrMapFull).
func (lb *LB) UpsertGroups(groups [][]Service) (errs []error) {
	errs = make([]error, len(groups))
	valid := make([][]Service, len(groups))
	for i, g := range groups {
		if lb.readOnly {
			errs[i] = errReadOnly
			continue
		}
		out := make([]Service, 0, len(g))
		for _, svc := range g {
			svc.Addr = svc.Addr.Unmap()
			svc.SourceRanges = masked(svc.SourceRanges)
			if err := validate(svc); err != nil {
				errs[i] = errors.Join(errs[i], err)
				continue
			}
			out = append(out, svc)
		}
		if errs[i] == nil {
			valid[i] = out
		}
	}
	// A start-up or full reconcile may bring every Service of the cluster
	// at once; chunks keep the plans and syscall buffers of one commit
	// small, which bounds kpr's peak memory, at no cost in syscalls. A
	// chunk never splits a group.
	for start := 0; start < len(groups); {
		end, n := start, 0
		for end < len(groups) && (n == 0 || n+len(valid[end]) <= maxServicesPerCommit) {
			n += len(valid[end])
			end++
		}
		lb.upsertChunk(valid[start:end], errs[start:end])
		start = end
	}
	return errs
}

// maxServicesPerCommit is how many Services one commit writes at most.
const maxServicesPerCommit = 1024

// upsertChunk writes the groups whose errs entry is still nil and sets it
// for those it could not write.
func (lb *LB) upsertChunk(groups [][]Service, errs []error) {
	var flat []Service
	pending := 0
	for i, g := range groups {
		if errs[i] == nil && len(g) > 0 {
			flat = append(flat, g...)
			pending++
		}
	}
	if pending == 0 {
		return
	}
	// Fast path: the whole chunk fits, so write it in seven batched steps.
	plans, err := lb.planAll(flat)
	if err == nil {
		if err = lb.commit(plans); err == nil {
			return
		}
	}
	if !errors.Is(err, ErrMapFull) || pending == 1 {
		for i, g := range groups {
			if errs[i] == nil && len(g) > 0 {
				errs[i] = err
			}
		}
		return
	}
	// Not everything fits: apply one group at a time, each atomically,
	// so as many as possible are served and the rest are reported.
	for i, g := range groups {
		if errs[i] != nil || len(g) == 0 {
			continue
		}
		p, err := lb.planAll(g)
		if err == nil {
			err = lb.commit(p)
		}
		errs[i] = err
	}
}

// MapFullError is a change refused because it needs more entries than the
// maps have left. Nothing of it was written.
type MapFullError struct {
	// Frontends are the frontends of the refused change.
	Frontends []VIP
	// Short are the maps that lacked room.
	Short []MapShortage
}

// MapShortage is one map a refused change did not fit in.
type MapShortage struct {
	Map string // the BPF map's name
	// Flag is the `kpr run` flag that sizes the map; empty for the one
	// limit no flag raises, the backend slots of one frontend
	// (maxSlots): Need and Have then count that frontend's slots.
	Flag       string
	Need, Have int
}

// maxSlots is how many backend slots one frontend has at most: the master
// entry counts them in 16 bits (svc_value.count).
const maxSlots = 1<<16 - 1

func (e *MapFullError) Error() string {
	what := "a batch of services"
	if len(e.Frontends) == 1 {
		what = "service " + e.Frontends[0].String()
	} else if len(e.Frontends) > 1 {
		what = fmt.Sprintf("%d frontends (%s, ...)", len(e.Frontends), e.Frontends[0])
	}
	var short, flags, remedies []string
	for _, s := range e.Short {
		if s.Flag == "" {
			short = append(short, fmt.Sprintf("a frontend's backend slots in %s need %d of at most %d", s.Map, s.Need, s.Have))
			remedies = append(remedies, "fewer endpoints make it fit (no flag raises the limit)")
			continue
		}
		short = append(short, fmt.Sprintf("%s needs %d of %d entries", s.Map, s.Need, s.Have))
		// The affinity match map is sized by the service map's flag.
		if !slices.Contains(flags, s.Flag) {
			flags = append(flags, s.Flag)
		}
	}
	if len(flags) > 0 {
		remedies = append(remedies, fmt.Sprintf("raise %s (kpr run) and restart kpr: the maps are carried over", strings.Join(flags, " and ")))
	}
	return fmt.Sprintf("%v: %s refused, %s; %s", ErrMapFull, what, strings.Join(short, ", "), strings.Join(remedies, "; "))
}

func (e *MapFullError) Unwrap() error { return ErrMapFull }

// planAll allocates ids for a batch and checks that it fits. On error the
// allocations are released and nothing is left behind.
func (lb *LB) planAll(svcs []Service) ([]*plan, error) {
	plans := make([]*plan, 0, len(svcs))
	newEntries := 0
	for _, svc := range svcs {
		if n := len(svc.Backends); n > maxSlots {
			lb.abandon(plans)
			return nil, &MapFullError{Frontends: []VIP{svc.VIP},
				Short: []MapShortage{{Map: bpf.KprMapKprServices, Need: n, Have: maxSlots}}}
		}
		p, err := lb.plan(svc)
		if err != nil {
			lb.abandon(append(plans, p))
			return nil, err
		}
		plans = append(plans, p)
		newEntries += p.newCount
	}
	// Planning already registered new backends and reverse-NAT ids.
	var short []MapShortage
	if n, max := lb.svcEntries+newEntries, lb.services.maxEntries(); n > max {
		short = append(short, MapShortage{bpf.KprMapKprServices, "--map-size-services", n, max})
	}
	if n, max := len(lb.backendOf), lb.backends.maxEntries(); n > max {
		short = append(short, MapShortage{bpf.KprMapKprBackends, "--map-size-backends", n, max})
	}
	if n, max := len(lb.revNatRefs), lb.revNat.maxEntries(); n > max {
		short = append(short, MapShortage{bpf.KprMapKprRevNat, "--map-size-revnat", n, max})
	}
	// Step 4 adds the new matches before it removes the old ones, and
	// step 1 the new source ranges before step 6 trims the old: both
	// maps must hold the old and the new together for a moment.
	if gained := lb.gainedMatches(plans); gained > 0 {
		if n, max := len(lb.matches)+gained, lb.affinityMatch.maxEntries(); n > max {
			short = append(short, MapShortage{bpf.KprMapKprAffinityMatch, "--map-size-services", n, max})
		}
	}
	if added := lb.addedRanges(plans); added > 0 {
		if n, max := lb.ranges.entries+added, lb.ranges.t.maxEntries(); n > max {
			short = append(short, MapShortage{bpf.KprMapKprSrcRanges, "--map-size-src-ranges", n, max})
		}
	}
	if len(short) > 0 {
		lb.abandon(plans)
		e := &MapFullError{Short: short}
		if len(svcs) <= 16 {
			for _, svc := range svcs {
				e.Frontends = append(e.Frontends, svc.VIP)
			}
		}
		return nil, e
	}
	return plans, nil
}

func (lb *LB) plan(svc Service) (*plan, error) {
	p := &plan{svc: svc, old: lb.svcs[svc.VIPKey]}
	p.kind, _ = kindToBPF(svc.Kind) // validate refused kinds without a value
	oldSlots := 0
	if p.old == nil {
		p.newCount = 1
	} else {
		oldSlots = len(p.old.slots)
	}
	if n := len(svc.Backends) - oldSlots; n > 0 {
		p.newCount += n
	}
	for _, b := range svc.Backends {
		addr := newBackendAddr(b.Addr, b.Port, svc.Proto)
		id, ok := lb.backendIDs[addr]
		if !ok {
			var err error
			if id, err = lb.backendAlloc.allocate(); err != nil {
				return p, err
			}
			lb.backendIDs[addr] = id
			lb.backendOf[id] = backendEntry{addr: addr}
			p.created = append(p.created, id)
		}
		p.slots = append(p.slots, id)
	}
	if id, ok := lb.revNatIDs[svc.VIP]; ok {
		p.revNat = id
	} else {
		id, err := lb.revNatAlloc.allocate()
		if err != nil {
			return p, err
		}
		p.revNat, p.newRev = id, true
		lb.revNatIDs[svc.VIP] = id
		lb.revNatRefs[id] = 0
	}
	return p, nil
}

// abandon releases the ids plans allocated; nothing was written yet.
func (lb *LB) abandon(plans []*plan) {
	for _, p := range plans {
		if p == nil {
			continue
		}
		for _, id := range p.created {
			delete(lb.backendIDs, lb.backendOf[id].addr)
			delete(lb.backendOf, id)
			lb.backendAlloc.release(id)
		}
		if p.newRev {
			delete(lb.revNatIDs, p.svc.VIP)
			delete(lb.revNatRefs, p.revNat)
			lb.revNatAlloc.release(p.revNat)
		}
	}
}

func (lb *LB) commit(plans []*plan) error {
	// Steps 1-3. The batches are sized once: a start-up commits every
	// Service, and growing them by appending was most of what a commit
	// allocated.
	var created, slots, revNats int
	for _, p := range plans {
		created += len(p.created)
		slots += len(p.slots)
		if p.old == nil || p.old.revNat != p.revNat {
			revNats++
		}
	}
	bKeys := make([]uint32, 0, created)
	bVals := make([]bpf.KprBackend, 0, created)
	sKeys := make([]bpf.KprSvcKey, 0, slots)
	sVals := make([]bpf.KprSvcValue, 0, slots)
	rKeys := make([]uint32, 0, revNats)
	rVals := make([]bpf.KprRevNatValue, 0, revNats)
	for _, p := range plans {
		for _, id := range p.created {
			a := lb.backendOf[id].addr
			bKeys = append(bKeys, id)
			bVals = append(bVals, bpf.KprBackend{Addr: addrToBPF(a.Addr()), Port: portToBPF(a.port), Proto: uint8(a.proto)})
		}
		for i, id := range p.slots {
			sKeys = append(sKeys, p.svc.bpfKey(i+1))
			sVals = append(sVals, bpf.KprSvcValue{BackendId: id})
		}
		if p.old == nil || p.old.revNat != p.revNat {
			rKeys = append(rKeys, p.revNat)
			rVals = append(rVals, bpf.KprRevNatValue{Addr: addrToBPF(p.svc.Addr), Port: portToBPF(p.svc.Port)})
		}
	}
	ranges := lb.rangesBefore(plans)
	if err := lb.backends.put(bKeys, bVals); err != nil {
		return lb.rollback(plans, ranges, err)
	}
	if err := lb.addRanges(plans); err != nil {
		return lb.rollback(plans, ranges, err)
	}
	if err := lb.services.put(sKeys, sVals); err != nil {
		return lb.rollback(plans, ranges, err)
	}
	if err := lb.revNat.put(rKeys, rVals); err != nil {
		return lb.rollback(plans, ranges, err)
	}
	// Step 4.
	gained, lost := lb.matchChanges(plans)
	if err := lb.affinityMatch.put(gained, make([]uint8, len(gained))); err != nil {
		return lb.rollback(plans, ranges, err)
	}
	if err := lb.affinityMatch.delete(lost); err != nil {
		return lb.rollback(plans, ranges, err)
	}

	// Step 5: the switch-over.
	lb.publishTables(plans)
	mKeys := make([]bpf.KprSvcKey, 0, len(plans))
	mVals := make([]bpf.KprSvcValue, 0, len(plans))
	for _, p := range plans {
		mKeys = append(mKeys, p.svc.bpfKey(0))
		mVals = append(mVals, bpf.KprSvcValue{Count: uint16(len(p.slots)), RevNatId: p.revNat,
			AffinityTimeout: p.svc.AffinityTimeout, Kind: p.kind, Flags: p.svc.flags()})
	}
	if err := lb.services.put(mKeys, mVals); err != nil {
		return lb.rollback(plans, ranges, err)
	}

	// The maps now serve the new state; account for it, then tidy up.
	var surplus []bpf.KprSvcKey
	var released []uint32
	for _, p := range plans {
		st := &svcState{revNat: p.revNat, kind: p.kind, affinityTimeout: p.svc.AffinityTimeout, flags: p.svc.flags(), slots: p.slots}
		lb.svcEntries += p.newCount
		if p.old != nil {
			for i := len(p.slots); i < len(p.old.slots); i++ {
				surplus = append(surplus, p.svc.bpfKey(i+1))
				lb.svcEntries--
			}
			released = append(released, p.old.slots...)
			if p.old.revNat != 0 && p.old.revNat != p.revNat {
				lb.revNatRefs[p.old.revNat]--
			}
		}
		if p.old == nil || p.old.revNat != p.revNat {
			lb.revNatRefs[p.revNat]++
		}
		for _, id := range p.slots {
			e := lb.backendOf[id]
			e.refs++
			lb.backendOf[id] = e
		}
		lb.svcs[p.svc.VIPKey] = st
	}
	for _, m := range gained {
		lb.matches[m] = struct{}{}
	}
	for _, m := range lost {
		delete(lb.matches, m)
	}
	// Steps 6 and 7.
	lb.dropTables(plans)
	if err := lb.services.delete(surplus); err != nil {
		return fmt.Errorf("services are updated, but removing surplus slots failed (a resync retries): %w", err)
	}
	if err := lb.trimRanges(plans, ranges); err != nil {
		return fmt.Errorf("services are updated, but removing source ranges no longer asked for failed (the next sync retries): %w", err)
	}
	return lb.release(released)
}

// publishTables is step 5's part for the Maglev tables: each frontend
// whose new state has a table gets it, before its master switches.
func (lb *LB) publishTables(plans []*plan) {
	if lb.maglev == nil {
		return
	}
	for _, p := range plans {
		next := &svcState{revNat: p.revNat, kind: p.kind, slots: p.slots}
		if _, ok := lb.maglev.want(next); ok {
			lb.maglev.report(lb.maglev.syncTo(p.svc.VIPKey, next))
		}
	}
}

// dropTables is step 6's part for the Maglev tables: the frontends whose
// new state, written now, has none lose theirs.
func (lb *LB) dropTables(plans []*plan) {
	if lb.maglev == nil {
		return
	}
	for _, p := range plans {
		st := lb.svcs[p.svc.VIPKey]
		if _, ok := lb.maglev.want(st); !ok {
			lb.maglev.report(lb.maglev.drop(p.svc.VIPKey, st.revNat))
		}
	}
}

// restoreTables gives the frontends of plans the tables of their old
// state, for a rollback once their masters are restored.
func (lb *LB) restoreTables(plans []*plan) {
	if lb.maglev == nil {
		return
	}
	for _, p := range plans {
		lb.maglev.report(lb.maglev.syncTo(p.svc.VIPKey, p.old))
	}
}

// gainedMatches counts the affinity matches the plans add.
func (lb *LB) gainedMatches(plans []*plan) int {
	n := 0
	for _, p := range plans {
		if p.svc.AffinityTimeout != 0 {
			gained, _ := lb.matchChanges([]*plan{p})
			n += len(gained)
		}
	}
	return n
}

// addedRanges counts the source-range entries the plans add: the ranges
// they ask for that the map does not hold for their frontend yet, each
// once (both scopes of a frontend share its ranges).
func (lb *LB) addedRanges(plans []*plan) int {
	var seen map[VIP][]netip.Prefix
	n := 0
	for _, p := range plans {
		for _, r := range p.svc.SourceRanges {
			if slices.Contains(lb.ranges.held[p.svc.VIP], r) || slices.Contains(seen[p.svc.VIP], r) {
				continue
			}
			if seen == nil {
				seen = map[VIP][]netip.Prefix{}
			}
			seen[p.svc.VIP] = append(seen[p.svc.VIP], r)
			n++
		}
	}
	return n
}

// masked returns ranges masked, as the source-range map holds them.
func masked(ranges []netip.Prefix) []netip.Prefix {
	if len(ranges) == 0 {
		return nil
	}
	out := make([]netip.Prefix, len(ranges))
	for i, p := range ranges {
		out[i] = p.Masked()
	}
	return out
}

// rangesBefore returns, for every frontend whose source ranges the plans
// may change, the ranges the map holds for it now: what step 6 trims to
// the new ranges, or the undo back to these.
func (lb *LB) rangesBefore(plans []*plan) map[VIP][]netip.Prefix {
	var out map[VIP][]netip.Prefix
	for _, p := range plans {
		held := lb.ranges.held[p.svc.VIP]
		if len(p.svc.SourceRanges) == 0 && len(held) == 0 {
			continue
		}
		if out == nil {
			out = map[VIP][]netip.Prefix{}
		}
		if _, ok := out[p.svc.VIP]; !ok {
			out[p.svc.VIP] = slices.Clone(held)
		}
	}
	return out
}

// addRanges is step 1's part for the source-range map: each frontend gets
// the ranges its new masters ask for, beside the ones it has.
func (lb *LB) addRanges(plans []*plan) error {
	for _, p := range plans {
		if len(p.svc.SourceRanges) > 0 {
			if err := lb.ranges.add(p.svc.VIP, p.svc.SourceRanges); err != nil {
				return err
			}
		}
	}
	return nil
}

// trimRanges is step 6's part for the source-range map: each frontend of
// before keeps only the ranges the plans' masters ask for. A master of the
// frontend that the plans do not write (its other scope) may ask for any
// range the map holds, so then they all stay.
func (lb *LB) trimRanges(plans []*plan, before map[VIP][]netip.Prefix) error {
	if len(before) == 0 {
		return nil
	}
	asked := map[VIP][]netip.Prefix{}
	written := map[VIPKey]bool{}
	for _, p := range plans {
		asked[p.svc.VIP] = append(asked[p.svc.VIP], p.svc.SourceRanges...)
		written[p.svc.VIPKey] = true
	}
	var errs []error
	for vip := range before {
		if lb.othersAskForRanges(vip, written) {
			continue
		}
		errs = append(errs, lb.ranges.trim(vip, asked[vip]))
	}
	return errors.Join(errs...)
}

// othersAskForRanges reports whether a master of vip other than those
// skip names asks for source ranges.
func (lb *LB) othersAskForRanges(vip VIP, skip map[VIPKey]bool) bool {
	for _, scope := range []Scope{ScopeInternal, ScopeExternal} {
		key := VIPKey{VIP: vip, Scope: scope}
		if st := lb.svcs[key]; st != nil && !skip[key] && st.flags&svcFlagSourceRanges != 0 {
			return true
		}
	}
	return false
}

// matchChanges lists the affinity match entries the plans add and remove.
func (lb *LB) matchChanges(plans []*plan) (gained, lost []bpf.KprAffinityMatchKey) {
	for _, p := range plans {
		next := matchKeys(p.svc.VIPKey, &svcState{revNat: p.revNat, affinityTimeout: p.svc.AffinityTimeout, slots: p.slots})
		keep := make(map[bpf.KprAffinityMatchKey]struct{}, len(next))
		for _, m := range next {
			keep[m] = struct{}{}
			if _, ok := lb.matches[m]; !ok {
				gained = append(gained, m)
			}
		}
		for _, m := range matchKeys(p.svc.VIPKey, p.old) {
			if _, ok := keep[m]; !ok {
				lost = append(lost, m)
			}
		}
	}
	return gained, lost
}

// release drops one slot reference from each backend id and deletes the
// backends nothing points at any more.
func (lb *LB) release(ids []uint32) error {
	var orphans []uint32
	for _, id := range ids {
		if id == 0 {
			continue
		}
		e, ok := lb.backendOf[id]
		if !ok {
			continue // already gone
		}
		e.refs--
		lb.backendOf[id] = e
		if e.refs <= 0 {
			orphans = append(orphans, id)
		}
	}
	return lb.dropBackends(orphans)
}

func (lb *LB) dropBackends(ids []uint32) error {
	var gone []uint32
	for _, id := range ids {
		if e, ok := lb.backendOf[id]; !ok || e.refs > 0 {
			continue // already gone, or claimed again by a later plan
		}
		gone = append(gone, id)
	}
	if err := lb.backends.delete(gone); err != nil {
		return fmt.Errorf("removing unused backends failed (a resync retries): %w", err)
	}
	for _, id := range gone {
		delete(lb.backendIDs, lb.backendOf[id].addr)
		delete(lb.backendOf, id)
		lb.backendAlloc.release(id)
	}
	return nil
}

// rollback undoes steps 1-5 after a failed write: old slots get their old
// backend ids back, new slots, backends, reverse-NAT entries, affinity
// matches and source ranges go, and removed matches return. Masters that
// were already switched are switched back first.
func (lb *LB) rollback(plans []*plan, ranges map[VIP][]netip.Prefix, cause error) error {
	var restoreKeys, dropKeys []bpf.KprSvcKey
	var restoreVals []bpf.KprSvcValue
	var dropRevNats, dropBackends []uint32
	for _, p := range plans {
		if p.old == nil {
			dropKeys = append(dropKeys, p.svc.bpfKey(0))
		} else {
			restoreKeys = append(restoreKeys, p.svc.bpfKey(0))
			restoreVals = append(restoreVals, bpf.KprSvcValue{Count: uint16(len(p.old.slots)), RevNatId: p.old.revNat,
				AffinityTimeout: p.old.affinityTimeout, Kind: p.old.kind, Flags: p.old.flags})
		}
		oldN := 0
		if p.old != nil {
			oldN = len(p.old.slots)
		}
		for i := range p.slots {
			if i < oldN {
				restoreKeys = append(restoreKeys, p.svc.bpfKey(i+1))
				restoreVals = append(restoreVals, bpf.KprSvcValue{BackendId: p.old.slots[i]})
			} else {
				dropKeys = append(dropKeys, p.svc.bpfKey(i+1))
			}
		}
		if p.newRev {
			dropRevNats = append(dropRevNats, p.revNat)
		}
		dropBackends = append(dropBackends, p.created...)
	}
	// lb.matches still holds the old state: it changes only after the
	// switch-over succeeded.
	gained, lost := lb.matchChanges(plans)
	// Masters first (dropKeys starts with the new masters), then slots.
	errs := []error{cause,
		lb.services.delete(dropKeys),
		lb.services.put(restoreKeys, restoreVals),
		lb.restoreRanges(ranges),
	}
	lb.restoreTables(plans)
	errs = append(errs,
		lb.affinityMatch.delete(gained),
		lb.affinityMatch.put(lost, make([]uint8, len(lost))),
		lb.revNat.delete(dropRevNats),
		lb.backends.delete(dropBackends),
	)
	lb.abandon(plans)
	return fmt.Errorf("writing services failed and was rolled back: %w", errors.Join(errs...))
}

// restoreRanges gives each frontend of before the source ranges it had.
func (lb *LB) restoreRanges(before map[VIP][]netip.Prefix) error {
	var errs []error
	for vip, held := range before {
		errs = append(errs, lb.ranges.trim(vip, held))
	}
	return errors.Join(errs...)
}

// Delete removes the given VIPKeys: master first, so lookups stop at
// once, then slots, affinity matches, the source ranges no master asks for
// any more, the reverse-NAT entry and orphaned backends.
func (lb *LB) Delete(keys ...VIPKey) error {
	if lb.readOnly {
		return errReadOnly
	}
	var masters, slots []bpf.KprSvcKey
	var matches []bpf.KprAffinityMatchKey
	var released []uint32
	revNats := map[uint32]VIP{}
	var gone []VIPKey
	for _, key := range keys {
		key.Addr = key.Addr.Unmap()
		st, ok := lb.svcs[key]
		if !ok {
			continue
		}
		gone = append(gone, key)
		masters = append(masters, key.bpfKey(0))
		for i := range st.slots {
			slots = append(slots, key.bpfKey(i+1))
		}
		released = append(released, st.slots...)
		matches = append(matches, matchKeys(key, st)...)
		if st.revNat != 0 {
			lb.revNatRefs[st.revNat]--
			if lb.revNatRefs[st.revNat] <= 0 {
				revNats[st.revNat] = key.VIP
			}
		}
	}
	if err := lb.services.delete(masters); err != nil {
		// Nothing is accounted as deleted yet; undo the reference drops.
		for _, key := range gone {
			if st := lb.svcs[key]; st.revNat != 0 {
				lb.revNatRefs[st.revNat]++
			}
		}
		return err
	}
	for _, key := range gone {
		st := lb.svcs[key]
		lb.svcEntries -= 1 + len(st.slots)
		delete(lb.svcs, key)
		if lb.maglev != nil {
			lb.maglev.report(lb.maglev.drop(key, st.revNat))
		}
	}
	var errs []error
	errs = append(errs, lb.services.delete(slots), lb.affinityMatch.delete(matches))
	for _, m := range matches {
		delete(lb.matches, m)
	}
	for _, key := range gone {
		if len(lb.ranges.held[key.VIP]) > 0 && !lb.othersAskForRanges(key.VIP, nil) {
			errs = append(errs, lb.ranges.trim(key.VIP, nil))
		}
	}
	freed := make([]uint32, 0, len(revNats))
	for id := range revNats {
		freed = append(freed, id)
	}
	errs = append(errs, lb.revNat.delete(freed))
	for id, fe := range revNats {
		delete(lb.revNatIDs, fe)
		delete(lb.revNatRefs, id)
		lb.revNatAlloc.release(id)
	}
	errs = append(errs, lb.release(released))
	return errors.Join(errs...)
}

// MapUsage is how full one of the LB's maps is.
type MapUsage struct {
	Map        string // the BPF map's name, as bpftool shows it
	Entries    int
	MaxEntries int
}

// Usage reports the fill level of every map the LB writes, in the order
// services, backends, reverse NAT, affinity match, so operators can alert
// before a map is full and Services are refused.
func (lb *LB) Usage() []MapUsage {
	return []MapUsage{
		{bpf.KprMapKprServices, lb.svcEntries, lb.services.maxEntries()},
		{bpf.KprMapKprBackends, len(lb.backendOf), lb.backends.maxEntries()},
		{bpf.KprMapKprRevNat, len(lb.revNatRefs), lb.revNat.maxEntries()},
		{bpf.KprMapKprAffinityMatch, len(lb.matches), lb.affinityMatch.maxEntries()},
	}
}
