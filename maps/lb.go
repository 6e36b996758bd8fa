package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// Scope selects which backend set of a frontend an entry holds.
type Scope uint8

const (
	// ScopeInternal serves sockets on this node; the cgroup hooks use it.
	ScopeInternal = Scope(bpf.KprSvcScopeSVC_SCOPE_INTERNAL)
	// ScopeExternal serves traffic from outside the node.
	ScopeExternal = Scope(bpf.KprSvcScopeSVC_SCOPE_EXTERNAL)
)

func (s Scope) String() string {
	if s == ScopeExternal {
		return "external"
	}
	return "internal"
}

// VIP is one address:port:protocol clients connect to.
type VIP struct {
	Addr  netip.Addr
	Port  uint16
	Proto dataplane.Protocol
}

func (f VIP) String() string {
	return netip.AddrPortFrom(f.Addr, f.Port).String() + "/" + f.Proto.String()
}

// VIPKey names one entry set in the service map.
type VIPKey struct {
	VIP
	Scope Scope
}

// Service is a frontend and scope with the backends that serve it.
type Service struct {
	VIPKey
	Kind dataplane.FrontendKind
	// AffinityTimeout is the ClientIP affinity timeout in seconds; 0 is off.
	AffinityTimeout uint32
	// SourceRanges, when not empty, are the only sources the tc programs
	// serve a new flow from outside from (loadBalancerSourceRanges): the
	// master asks for them by a flag, and they live in the source-range
	// map under the frontend's VIP, shared by both scopes. They must be of
	// the frontend's family.
	SourceRanges []netip.Prefix
	// Backends in slot order. An empty list makes connects fail.
	Backends []dataplane.Backend
}

// ErrMapFull is returned when a change needs more entries than a map has
// left. Nothing of the refused Service was written.
var ErrMapFull = errors.New("BPF map full")

// backendAddr is what makes two backends the same backend. It holds the
// address as 16 bytes rather than as a netip.Addr (24 bytes, one of them a
// pointer the collector scans) because the LB keeps one per backend twice,
// as a key and as a value, for every backend of the cluster: 20 bytes
// without pointers instead of 32 with one. Zoned addresses are refused by
// validate, so nothing is lost.
type backendAddr struct {
	addr  [16]byte
	port  uint16
	proto dataplane.Protocol
	is4   bool
}

func newBackendAddr(a netip.Addr, port uint16, proto dataplane.Protocol) backendAddr {
	return backendAddr{addr: a.As16(), port: port, proto: proto, is4: a.Is4()}
}

// Addr returns the address as it was given.
func (b backendAddr) Addr() netip.Addr {
	a := netip.AddrFrom16(b.addr)
	if b.is4 {
		return a.Unmap()
	}
	return a
}

// backendEntry is what the LB knows of one backend id.
type backendEntry struct {
	addr backendAddr
	// refs counts the slots pointing at the backend.
	refs int32
}

// svcState mirrors what the maps hold for one VIPKey.
type svcState struct {
	revNat uint32
	// kind is svc_value.kind as the map holds it (enum svc_kind), so an
	// unknown value survives a rollback unchanged.
	kind            uint8
	affinityTimeout uint32
	// flags is svc_value.flags as the map holds it (enum svc_flags).
	flags uint8
	// slots[i] is the backend id in slot i+1; 0 where the map lacks the slot.
	slots []uint32
}

// LB owns the service, backend, reverse-NAT and affinity match maps. It is
// not safe for concurrent use; the sync loop is its only writer.
type LB struct {
	tables

	svcs       map[VIPKey]*svcState
	svcEntries int // masters plus slots, as in the service map
	backendIDs map[backendAddr]uint32
	// backendOf holds every backend id in the backend map. Its keys are
	// also the backend ids in use: backendAlloc asks it rather than
	// keeping a set of its own.
	backendOf  map[uint32]backendEntry
	revNatIDs  map[VIP]uint32
	revNatRefs map[uint32]int // scopes using each reverse-NAT id
	// matches mirrors the affinity match map: the backends each Service
	// with ClientIP affinity has now.
	matches map[bpf.KprAffinityMatchKey]struct{}

	backendAlloc *idAllocator
	revNatAlloc  *idAllocator

	// readOnly LBs only look: they neither write nor collect garbage.
	readOnly bool
	// ranges are the source ranges the masters' flags refer to.
	ranges *SourceRanges
	// maglev, when set (NewMaglev), writes the Maglev tables of the
	// frontends the LB writes (--lb-algorithm maglev).
	maglev *Maglev
	// conntrack are the tc programs' conntrack maps, whose flows to
	// removed UDP backends DeleteUDPFlows deletes; none in memory.
	conntrack []*ebpf.Map

	// scan is the DriftScan in progress, if any, and touched the keys
	// written during its current stage.
	scan    *DriftScan
	touched touchedKeys
	// seen are the sets a DriftScan notes reported keys in, kept from one
	// scan to the next (see reuse).
	seen touchedKeys
}

// New opens the LB over loaded or pinned maps and adopts their contents.
func New(m *bpf.KprMaps) (*LB, error) {
	lb, err := newLB(bpfTables(m), newBPFTable[bpf.KprSrcRangeKey, uint8](m.KprSrcRanges), false)
	if lb != nil {
		lb.conntrack = []*ebpf.Map{m.KprConntrack, m.KprCtNew}
	}
	return lb, err
}

// OpenReadOnly reads the maps without ever writing them, for inspection
// tools such as `kpr dump` that run beside a live control plane.
func OpenReadOnly(m *bpf.KprMaps) (*LB, error) {
	return newLB(bpfTables(m), newBPFTable[bpf.KprSrcRangeKey, uint8](m.KprSrcRanges), true)
}

// tables are the maps an LB writes.
type tables struct {
	services      table[bpf.KprSvcKey, bpf.KprSvcValue]
	backends      table[uint32, bpf.KprBackend]
	revNat        table[uint32, bpf.KprRevNatValue]
	affinityMatch table[bpf.KprAffinityMatchKey, uint8]
}

func bpfTables(m *bpf.KprMaps) tables {
	return tables{
		services:      newBPFTable[bpf.KprSvcKey, bpf.KprSvcValue](m.KprServices),
		backends:      newBPFTable[uint32, bpf.KprBackend](m.KprBackends),
		revNat:        newBPFTable[uint32, bpf.KprRevNatValue](m.KprRevNat),
		affinityMatch: newBPFTable[bpf.KprAffinityMatchKey, uint8](m.KprAffinityMatch),
	}
}

func newLB(t tables, ranges table[bpf.KprSrcRangeKey, uint8], readOnly bool) (*LB, error) {
	lb := &LB{readOnly: readOnly}
	lb.tables = lb.tracked(t)
	var err error
	if lb.ranges, err = newSourceRanges(ranges, readOnly); err != nil {
		return nil, err
	}
	if err := lb.Resync(); err != nil {
		return nil, err
	}
	return lb, nil
}

// SourceRanges returns the writer of the source-range map that the
// masters with Service.SourceRanges set refer to.
func (lb *LB) SourceRanges() *SourceRanges { return lb.ranges }

// Resync rebuilds the in-memory view from the maps, so that later
// comparisons see drift (entries changed behind kpr's back), and removes
// entries no lookup can reach: slots without a master, slots past a
// master's count, and unreferenced backends and reverse-NAT entries.
func (lb *LB) Resync() error {
	if lb.scan != nil {
		lb.scan.abandon() // it compares with the view rebuilt here
	}
	if err := lb.ranges.Resync(); err != nil {
		return err
	}
	lb.svcs = map[VIPKey]*svcState{}
	lb.svcEntries = 0
	lb.backendIDs = map[backendAddr]uint32{}
	lb.backendOf = map[uint32]backendEntry{}
	lb.revNatIDs = map[VIP]uint32{}
	lb.revNatRefs = map[uint32]int{}
	lb.backendAlloc = newIDAllocatorOver("backend", 1, 1<<32-1, backendIDSet{lb})
	lb.revNatAlloc = newIDAllocator("reverse-NAT", 1, 1<<32-1)

	type slotEntry struct {
		key VIPKey
		raw bpf.KprSvcKey
		id  uint32
	}
	var slots []slotEntry
	err := lb.services.dump(func(k bpf.KprSvcKey, v bpf.KprSvcValue) {
		key := vipKeyFromBPF(k)
		if k.Slot != 0 {
			slots = append(slots, slotEntry{key, k, v.BackendId})
			return
		}
		lb.svcs[key] = &svcState{revNat: v.RevNatId, kind: v.Kind,
			affinityTimeout: v.AffinityTimeout, flags: v.Flags, slots: make([]uint32, v.Count)}
		lb.svcEntries++
	})
	if err != nil {
		return err
	}
	var unreachable []bpf.KprSvcKey
	for _, s := range slots {
		st := lb.svcs[s.key]
		if st == nil || int(s.raw.Slot) > len(st.slots) {
			unreachable = append(unreachable, s.raw)
			continue
		}
		st.slots[s.raw.Slot-1] = s.id
		lb.svcEntries++
	}

	err = lb.backends.dump(func(id uint32, b bpf.KprBackend) {
		addr := newBackendAddr(addrFromBPF(b.Addr), portFromBPF(b.Port), dataplane.Protocol(b.Proto))
		lb.backendOf[id] = backendEntry{addr: addr}
		lb.backendIDs[addr] = id
		lb.backendAlloc.reserve(id)
	})
	if err != nil {
		return err
	}
	revNats := map[uint32]VIP{}
	err = lb.revNat.dump(func(id uint32, v bpf.KprRevNatValue) {
		revNats[id] = VIP{Addr: addrFromBPF(v.Addr), Port: portFromBPF(v.Port)}
		lb.revNatAlloc.reserve(id)
	})
	if err != nil {
		return err
	}

	for key, st := range lb.svcs {
		for i, id := range st.slots {
			if e, ok := lb.backendOf[id]; ok {
				e.refs++
				lb.backendOf[id] = e
			} else {
				st.slots[i] = 0 // drift: the slot points nowhere
			}
		}
		fe, ok := revNats[st.revNat]
		if ok && fe.Addr == key.Addr && fe.Port == key.Port {
			lb.revNatIDs[key.VIP] = st.revNat
			lb.revNatRefs[st.revNat]++
		} else {
			st.revNat = 0 // drift: rewritten on the next upsert
		}
	}

	var orphanBackends []uint32
	for id, e := range lb.backendOf {
		if e.refs == 0 {
			orphanBackends = append(orphanBackends, id)
		}
	}
	var orphanRevNats []uint32
	for id := range revNats {
		if lb.revNatRefs[id] == 0 {
			orphanRevNats = append(orphanRevNats, id)
			lb.revNatAlloc.release(id)
		}
	}
	if lb.readOnly {
		return nil
	}
	if err := lb.services.delete(unreachable); err != nil {
		return err
	}
	if err := lb.revNat.delete(orphanRevNats); err != nil {
		return err
	}
	if err := lb.dropBackends(orphanBackends); err != nil {
		return err
	}
	if err := lb.RemoveUnaskedRanges(); err != nil {
		return err
	}
	return lb.resyncAffinityMatches()
}

// resyncAffinityMatches makes the match map hold exactly the backends of
// every Service with affinity, as the service map now has them.
func (lb *LB) resyncAffinityMatches() error {
	lb.matches = map[bpf.KprAffinityMatchKey]struct{}{}
	for key, st := range lb.svcs {
		for _, m := range matchKeys(key, st) {
			lb.matches[m] = struct{}{}
		}
	}
	var stale []bpf.KprAffinityMatchKey
	present := map[bpf.KprAffinityMatchKey]struct{}{}
	err := lb.affinityMatch.dump(func(k bpf.KprAffinityMatchKey, _ uint8) {
		if _, ok := lb.matches[k]; ok {
			present[k] = struct{}{}
		} else {
			stale = append(stale, k)
		}
	})
	if err != nil {
		return err
	}
	var missing []bpf.KprAffinityMatchKey
	for k := range lb.matches {
		if _, ok := present[k]; !ok {
			missing = append(missing, k)
		}
	}
	if err := lb.affinityMatch.delete(stale); err != nil {
		return err
	}
	return lb.affinityMatch.put(missing, make([]uint8, len(missing)))
}

// matchKeys are the affinity match entries st needs: one per backend while
// ClientIP affinity is on, none otherwise.
func matchKeys(key VIPKey, st *svcState) []bpf.KprAffinityMatchKey {
	if st == nil || st.affinityTimeout == 0 || st.revNat == 0 {
		return nil
	}
	out := make([]bpf.KprAffinityMatchKey, 0, len(st.slots))
	for _, id := range st.slots {
		if id != 0 {
			out = append(out, bpf.KprAffinityMatchKey{BackendId: id, RevNatId: st.revNat, Scope: uint8(key.Scope)})
		}
	}
	return out
}

// Get returns what the maps hold for key, resolved to addresses.
// Missing slots or backends show up as the zero Backend.
func (lb *LB) Get(key VIPKey) (Service, bool) {
	st, ok := lb.svcs[key]
	if !ok {
		return Service{}, false
	}
	kind, _ := kindFromBPF(st.kind) // unknownKind when not a known kind
	svc := Service{VIPKey: key, Kind: kind, AffinityTimeout: st.affinityTimeout}
	if st.flags&svcFlagSourceRanges != 0 {
		svc.SourceRanges = lb.ranges.Get(key.VIP)
	}
	for _, id := range st.slots {
		var b dataplane.Backend
		if e, ok := lb.backendOf[id]; ok {
			b = dataplane.Backend{Addr: e.addr.Addr(), Port: e.addr.port}
		}
		svc.Backends = append(svc.Backends, b)
	}
	return svc, true
}

// List returns every Service in the maps, sorted by frontend and scope.
func (lb *LB) List() []Service {
	out := make([]Service, 0, len(lb.svcs))
	for key := range lb.svcs {
		svc, _ := lb.Get(key)
		out = append(out, svc)
	}
	sort.Slice(out, func(i, j int) bool { return keyLess(out[i].VIPKey, out[j].VIPKey) })
	return out
}

// Keys returns every VIPKey in the maps.
func (lb *LB) Keys() []VIPKey {
	out := make([]VIPKey, 0, len(lb.svcs))
	for key := range lb.svcs {
		out = append(out, key)
	}
	return out
}

// Matches reports whether the maps already hold exactly svc, intact.
func (lb *LB) Matches(svc Service) bool {
	st, ok := lb.svcs[svc.VIPKey]
	kind, known := kindToBPF(svc.Kind)
	if !ok || !known || st.revNat == 0 || st.kind != kind || st.affinityTimeout != svc.AffinityTimeout || st.flags != svc.flags() ||
		len(st.slots) != len(svc.Backends) || !lb.ranges.holdsExactly(svc.VIP, svc.SourceRanges) {
		return false
	}
	for i, id := range st.slots {
		e, ok := lb.backendOf[id]
		if !ok || e.addr != newBackendAddr(svc.Backends[i].Addr, svc.Backends[i].Port, svc.Proto) {
			return false
		}
	}
	return true
}

// svcFlagSourceRanges is SVC_F_SOURCE_RANGES of enum svc_flags
// (bpf/types.h), which bpf2go does not generate: srcranges_test.go checks
// it against the tc object's BTF.
const svcFlagSourceRanges = 1

// flags is svc_value.flags for svc.
func (svc Service) flags() uint8 {
	if len(svc.SourceRanges) > 0 {
		return svcFlagSourceRanges
	}
	return 0
}

func keyLess(a, b VIPKey) bool {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c < 0
	}
	if a.Port != b.Port {
		return a.Port < b.Port
	}
	if a.Proto != b.Proto {
		return a.Proto < b.Proto
	}
	return a.Scope < b.Scope
}

func vipKeyFromBPF(k bpf.KprSvcKey) VIPKey {
	return VIPKey{
		VIP:   VIP{Addr: addrFromBPF(k.Addr), Port: portFromBPF(k.Port), Proto: dataplane.Protocol(k.Proto)},
		Scope: Scope(k.Scope),
	}
}

func (k VIPKey) bpfKey(slot int) bpf.KprSvcKey {
	return bpf.KprSvcKey{Addr: addrToBPF(k.Addr), Port: portToBPF(k.Port), Proto: uint8(k.Proto),
		Scope: uint8(k.Scope), Slot: uint16(slot)}
}

func validate(svc Service) error {
	if !svc.Addr.IsValid() {
		return fmt.Errorf("service %s: invalid frontend address", svc.VIP)
	}
	if _, ok := kindToBPF(svc.Kind); !ok {
		return fmt.Errorf("service %s: frontend kind %s has no value in enum svc_kind (bpf/types.h) to store it as", svc.VIP, svc.Kind)
	}
	if svc.Proto != dataplane.TCP && svc.Proto != dataplane.UDP {
		return fmt.Errorf("service %s: protocol %s is not supported by the eBPF dataplane", svc.VIP, svc.Proto)
	}
	// Two scopes a frontend at most: kpr_maglev is sized for as many
	// tables per reverse-NAT id (MaglevEntriesPerRevNat).
	if svc.Scope != ScopeInternal && svc.Scope != ScopeExternal {
		return fmt.Errorf("service %s: scope %d is neither internal nor external", svc.VIP, svc.Scope)
	}
	for _, b := range svc.Backends {
		if !b.Addr.IsValid() || b.Addr.Zone() != "" || b.Addr.Is4() != svc.Addr.Unmap().Is4() || b.Port == 0 {
			return fmt.Errorf("service %s: backend %s is invalid, zoned or of the wrong IP family", svc.VIP, b)
		}
	}
	for _, p := range svc.SourceRanges {
		if !p.IsValid() || p.Addr().Zone() != "" || p.Addr().Is4() != svc.Addr.Unmap().Is4() {
			return fmt.Errorf("service %s: source range %s is invalid, zoned or of the wrong IP family", svc.VIP, p)
		}
	}
	return nil
}

// backendIDSet makes backendOf's keys the backend allocator's set of ids
// in use.
type backendIDSet struct{ lb *LB }

func (s backendIDSet) has(id uint32) bool { _, ok := s.lb.backendOf[id]; return ok }

// add holds id with an empty entry until the caller fills it in.
func (s backendIDSet) add(id uint32) {
	if _, ok := s.lb.backendOf[id]; !ok {
		s.lb.backendOf[id] = backendEntry{}
	}
}

func (s backendIDSet) remove(id uint32) { delete(s.lb.backendOf, id) }
func (s backendIDSet) len() int         { return len(s.lb.backendOf) }
