package maps

import (
	"github.com/kpr-io/kpr/bpf"
)

// DriftScan is InSync cut into steps, so that the sync loop can check the
// maps for drift a few thousand entries at a time and write other changes
// between the steps. Like everything on the LB it runs on the LB's one
// goroutine: the steps and the writes between them never overlap, so no
// lock is needed and every comparison sees the LB's view as it is at that
// moment.
//
// What makes it exact despite the writes in between:
//   - A step reads a batch of entries from the kernel and compares each
//     with the LB's view at once, with no write in between, so a mismatch
//     is real drift. The kernel's batch read of a hash map goes bucket by
//     bucket, and a key never changes bucket, so an entry that nobody
//     writes while its table is scanned is reported exactly once.
//   - The LB records every key it writes or deletes while a table is
//     scanned (touched). Those entries are left out on both sides of the
//     count that finds entries missing from the kernel: the reported ones
//     not touched (seen minus touched) must match the LB's entries not
//     touched. kpr itself has just written the touched entries; the next
//     scan checks them.
//
// A Resync in the middle abandons the scan (it reports not in sync), since
// Resync rebuilds the view the scan compares with.
type DriftScan struct {
	lb      *LB
	stage   int
	drifted bool
	err     error
	done    bool

	// cursor reads the current stage's table.
	cursor scanCursor
	// checked counts, per stage, the reported entries not touched when
	// reported; seen holds their keys so that entries touched after being
	// reported can be taken out of the count at the end.
	svcSeen     map[bpf.KprSvcKey]struct{}
	backendSeen map[uint32]struct{}
	revNatSeen  map[uint32]struct{}
	matchSeen   map[bpf.KprAffinityMatchKey]struct{}
}

// touchedKeys is a set of keys per table: those the LB wrote or deleted
// during the current stage of a scan (nil maps when no scan runs), or
// those a scan saw.
type touchedKeys struct {
	services map[bpf.KprSvcKey]struct{}
	backends map[uint32]struct{}
	revNat   map[uint32]struct{}
	matches  map[bpf.KprAffinityMatchKey]struct{}
}

// scanCursor reads one table a chunk at a time.
type scanCursor interface {
	next(max int) (done bool, err error)
}

// Scan stages, one per table.
const (
	scanServices = iota
	scanBackends
	scanRevNat
	scanMatches
	scanStages
)

// StartDriftScan begins a stepwise InSync. A scan already running is
// abandoned. Call Step until it reports done.
func (lb *LB) StartDriftScan() *DriftScan {
	if lb.scan != nil {
		lb.scan.abandon()
	}
	s := &DriftScan{lb: lb}
	lb.scan = s
	s.startStage()
	return s
}

// abandon ends the scan with a not-in-sync result.
func (s *DriftScan) abandon() {
	if s.done {
		return
	}
	s.done, s.drifted = true, true
	s.finish()
}

func (s *DriftScan) finish() {
	s.done = true
	s.cursor = nil
	s.svcSeen, s.backendSeen, s.revNatSeen, s.matchSeen = nil, nil, nil, nil
	if s.lb.scan == s {
		s.lb.scan = nil
		s.lb.touched = touchedKeys{}
	}
}

// Step compares up to max entries of the maps with the LB's view. Once
// done, inSync tells whether the maps held exactly what the LB believes
// (apart from entries the LB wrote during the scan); an error ends the
// scan.
func (s *DriftScan) Step(max int) (done, inSync bool, err error) {
	if s.done {
		return true, !s.drifted && s.err == nil, s.err
	}
	stageDone, err := s.cursor.next(max)
	if err != nil {
		s.err = err
		s.finish()
		return true, false, err
	}
	if s.drifted {
		s.finish()
		return true, false, nil
	}
	if !stageDone {
		return false, false, nil
	}
	if !s.countsMatch() {
		s.drifted = true
		s.finish()
		return true, false, nil
	}
	s.stage++
	if s.stage == scanStages {
		s.finish()
		return true, true, nil
	}
	s.startStage()
	return false, false, nil
}

// startStage sets up the cursor and touched set of the current stage.
func (s *DriftScan) startStage() {
	lb := s.lb
	lb.touched = touchedKeys{}
	switch s.stage {
	case scanServices:
		lb.touched.services = map[bpf.KprSvcKey]struct{}{}
		s.svcSeen = reuse(&lb.seen.services, lb.svcEntries)
		s.cursor = lb.services.scan(func(k bpf.KprSvcKey, v bpf.KprSvcValue) {
			if _, ok := lb.touched.services[k]; ok || s.drifted {
				return
			}
			s.svcSeen[k] = struct{}{}
			s.drifted = !lb.holdsServiceEntry(k, v)
		})
	case scanBackends:
		s.svcSeen = nil
		lb.touched.backends = map[uint32]struct{}{}
		s.backendSeen = reuse(&lb.seen.backends, len(lb.backendOf))
		s.cursor = lb.backends.scan(func(id uint32, b bpf.KprBackend) {
			if _, ok := lb.touched.backends[id]; ok || s.drifted {
				return
			}
			s.backendSeen[id] = struct{}{}
			s.drifted = !lb.holdsBackend(id, b)
		})
	case scanRevNat:
		s.backendSeen = nil
		lb.touched.revNat = map[uint32]struct{}{}
		s.revNatSeen = reuse(&lb.seen.revNat, len(lb.revNatRefs))
		s.cursor = lb.revNat.scan(func(id uint32, _ bpf.KprRevNatValue) {
			if _, ok := lb.touched.revNat[id]; ok || s.drifted {
				return
			}
			s.revNatSeen[id] = struct{}{}
			_, ok := lb.revNatRefs[id]
			s.drifted = !ok
		})
	case scanMatches:
		s.revNatSeen = nil
		lb.touched.matches = map[bpf.KprAffinityMatchKey]struct{}{}
		s.matchSeen = reuse(&lb.seen.matches, len(lb.matches))
		s.cursor = lb.affinityMatch.scan(func(k bpf.KprAffinityMatchKey, _ uint8) {
			if _, ok := lb.touched.matches[k]; ok || s.drifted {
				return
			}
			s.matchSeen[k] = struct{}{}
			_, ok := lb.matches[k]
			s.drifted = !ok
		})
	}
}

// reuse empties the set *m for a new stage, keeping its memory: a scan
// every sync period would otherwise leave one key per map entry as garbage
// each time, and a collection cycle during a scan slows its steps.
func reuse[K comparable](m *map[K]struct{}, size int) map[K]struct{} {
	if *m == nil {
		*m = make(map[K]struct{}, size)
	} else {
		clear(*m)
	}
	return *m
}

// countsMatch is the end of a stage: every entry of the LB's view that was
// not touched during the stage must have been reported, untouched.
func (s *DriftScan) countsMatch() bool {
	lb := s.lb
	switch s.stage {
	case scanServices:
		return untouchedMatch(s.svcSeen, lb.touched.services, lb.svcEntries, func(k bpf.KprSvcKey) bool {
			st := lb.svcs[vipKeyFromBPF(k)]
			return st != nil && int(k.Slot) <= len(st.slots)
		})
	case scanBackends:
		return untouchedMatch(s.backendSeen, lb.touched.backends, len(lb.backendOf), func(id uint32) bool {
			_, ok := lb.backendOf[id]
			return ok
		})
	case scanRevNat:
		return untouchedMatch(s.revNatSeen, lb.touched.revNat, len(lb.revNatRefs), func(id uint32) bool {
			_, ok := lb.revNatRefs[id]
			return ok
		})
	default:
		return untouchedMatch(s.matchSeen, lb.touched.matches, len(lb.matches), func(k bpf.KprAffinityMatchKey) bool {
			_, ok := lb.matches[k]
			return ok
		})
	}
}

// untouchedMatch reports whether the reported entries that were never
// touched are as many as the LB's entries (total, of which held tells
// which touched keys it has) that were never touched.
func untouchedMatch[K comparable](seen, touched map[K]struct{}, total int, held func(K) bool) bool {
	reported := len(seen)
	for k := range touched {
		if _, ok := seen[k]; ok {
			reported-- // reported first, touched afterwards
		}
		if held(k) {
			total--
		}
	}
	return reported == total
}

// touch records keys a write passes to a table while a scan runs.
func touch[K comparable](set map[K]struct{}, keys []K) {
	if set == nil {
		return
	}
	for _, k := range keys {
		set[k] = struct{}{}
	}
}

// trackedTable records the keys written to a table in the LB's current
// touched set, for a DriftScan.
type trackedTable[K comparable, V any] struct {
	table[K, V]
	set func() map[K]struct{}
}

func (t trackedTable[K, V]) put(keys []K, values []V) error {
	touch(t.set(), keys)
	return t.table.put(keys, values)
}

func (t trackedTable[K, V]) delete(keys []K) error {
	touch(t.set(), keys)
	return t.table.delete(keys)
}

// tracked wraps every table so that writes during a scan are recorded.
func (lb *LB) tracked(t tables) tables {
	return tables{
		services:      trackedTable[bpf.KprSvcKey, bpf.KprSvcValue]{t.services, func() map[bpf.KprSvcKey]struct{} { return lb.touched.services }},
		backends:      trackedTable[uint32, bpf.KprBackend]{t.backends, func() map[uint32]struct{} { return lb.touched.backends }},
		revNat:        trackedTable[uint32, bpf.KprRevNatValue]{t.revNat, func() map[uint32]struct{} { return lb.touched.revNat }},
		affinityMatch: trackedTable[bpf.KprAffinityMatchKey, uint8]{t.affinityMatch, func() map[bpf.KprAffinityMatchKey]struct{} { return lb.touched.matches }},
	}
}
