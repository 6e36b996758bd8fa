package maps

import (
	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// InSync reports whether the maps hold exactly what the LB believes they
// hold. It only reads and compares, allocating nothing per entry, so a
// periodic reconcile can afford it where a full Resync (which rebuilds
// every id allocator and reference count) would stall the sync loop.
func (lb *LB) InSync() (bool, error) {
	inSync := true
	entries := 0
	err := lb.services.dump(func(k bpf.KprSvcKey, v bpf.KprSvcValue) {
		entries++
		if !inSync {
			return
		}
		inSync = lb.holdsServiceEntry(k, v)
	})
	if err != nil || !inSync || entries != lb.svcEntries {
		return false, err
	}
	backends := 0
	err = lb.backends.dump(func(id uint32, b bpf.KprBackend) {
		backends++
		if !inSync {
			return
		}
		inSync = lb.holdsBackend(id, b)
	})
	if err != nil || !inSync || backends != len(lb.backendOf) {
		return false, err
	}
	revNats := 0
	err = lb.revNat.dump(func(id uint32, v bpf.KprRevNatValue) {
		revNats++
		if _, ok := lb.revNatRefs[id]; !ok {
			inSync = false
		}
	})
	if err != nil || !inSync || revNats != len(lb.revNatRefs) {
		return false, err
	}
	matches := 0
	err = lb.affinityMatch.dump(func(k bpf.KprAffinityMatchKey, _ uint8) {
		matches++
		if _, ok := lb.matches[k]; !ok {
			inSync = false
		}
	})
	if err != nil || !inSync || matches != len(lb.matches) {
		return false, err
	}
	return lb.ranges.inSync()
}

// holdsServiceEntry reports whether a service map entry is what the LB's
// view says it is.
func (lb *LB) holdsServiceEntry(k bpf.KprSvcKey, v bpf.KprSvcValue) bool {
	st := lb.svcs[vipKeyFromBPF(k)]
	switch {
	case st == nil:
		return false
	case k.Slot == 0:
		return int(v.Count) == len(st.slots) && v.RevNatId == st.revNat && st.revNat != 0 &&
			v.AffinityTimeout == st.affinityTimeout && v.Kind == st.kind && v.Flags == st.flags
	default:
		return int(k.Slot) <= len(st.slots) && st.slots[k.Slot-1] == v.BackendId && v.BackendId != 0
	}
}

// holdsBackend reports whether a backend map entry is what the LB's view
// says it is.
func (lb *LB) holdsBackend(id uint32, b bpf.KprBackend) bool {
	want, ok := lb.backendOf[id]
	return ok && want.addr == newBackendAddr(addrFromBPF(b.Addr), portFromBPF(b.Port), dataplane.Protocol(b.Proto))
}
