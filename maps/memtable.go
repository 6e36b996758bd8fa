package maps

import (
	"errors"
	"slices"

	"github.com/kpr-io/kpr/bpf"
)

// NewInMemory returns an LB over in-memory tables of the given sizes. It
// behaves like the BPF-backed one, without a kernel, for tests of code that
// drives an LB.
func NewInMemory(services, backends, revNats int) *LB {
	return NewInMemorySized(map[string]int{
		bpf.KprMapKprServices: services, bpf.KprMapKprBackends: backends, bpf.KprMapKprRevNat: revNats})
}

// InMemoryMaps are the BPF maps, by name, that an LB from NewInMemorySized
// holds in memory: every map the LB's write path writes, except the Maglev
// tables, which need the kernel's maps of maps.
var InMemoryMaps = []string{bpf.KprMapKprServices, bpf.KprMapKprBackends, bpf.KprMapKprRevNat,
	bpf.KprMapKprAffinityMatch, bpf.KprMapKprSrcRanges}

// NewInMemorySized returns an LB over in-memory tables with the sizes
// given by BPF map name (one of InMemoryMaps), for tests that fill one map.
// A map not named gets the size bpf/maps.h gives it, the affinity match
// map that of the service map, as the loader sizes them.
func NewInMemorySized(sizes map[string]int) *LB {
	size := func(name string, def int) int {
		if n, ok := sizes[name]; ok {
			return n
		}
		return def
	}
	for name := range sizes {
		if !slices.Contains(InMemoryMaps, name) {
			panic("maps: NewInMemorySized: no in-memory map " + name)
		}
	}
	services := size(bpf.KprMapKprServices, 262144)
	fault := &writeFault{}
	t := tables{
		services:      newMemTable[bpf.KprSvcKey, bpf.KprSvcValue](services),
		backends:      newMemTable[uint32, bpf.KprBackend](size(bpf.KprMapKprBackends, 131072)),
		revNat:        newMemTable[uint32, bpf.KprRevNatValue](size(bpf.KprMapKprRevNat, 131072)),
		affinityMatch: newMemTable[bpf.KprAffinityMatchKey, uint8](size(bpf.KprMapKprAffinityMatch, services)),
	}
	t.services.(*memTable[bpf.KprSvcKey, bpf.KprSvcValue]).fault = fault
	t.backends.(*memTable[uint32, bpf.KprBackend]).fault = fault
	t.revNat.(*memTable[uint32, bpf.KprRevNatValue]).fault = fault
	t.affinityMatch.(*memTable[bpf.KprAffinityMatchKey, uint8]).fault = fault
	return mustLoadInMemory(t, newMemTable[bpf.KprSrcRangeKey, uint8](size(bpf.KprMapKprSrcRanges, 65536)), false)
}

func mustLoadInMemory(t tables, ranges table[bpf.KprSrcRangeKey, uint8], readOnly bool) *LB {
	lb, err := newLB(t, ranges, readOnly)
	if err != nil {
		panic("maps: in-memory tables cannot fail to load: " + err.Error())
	}
	return lb
}

// ReopenInMemory returns a second LB over the tables of lb, which must come
// from NewInMemory, as a restarted kpr opens the pinned maps: it adopts what
// they hold. Each LB sees the other's writes as drift, as with a second
// program writing the maps. readOnly opens it as OpenReadOnly does, to read
// what the tables hold rather than what lb believes they hold.
func (lb *LB) ReopenInMemory(readOnly bool) *LB {
	return mustLoadInMemory(tables{
		services:      lb.services.(trackedTable[bpf.KprSvcKey, bpf.KprSvcValue]).table,
		backends:      lb.backends.(trackedTable[uint32, bpf.KprBackend]).table,
		revNat:        lb.revNat.(trackedTable[uint32, bpf.KprRevNatValue]).table,
		affinityMatch: lb.affinityMatch.(trackedTable[bpf.KprAffinityMatchKey, uint8]).table,
	}, lb.ranges.t, readOnly)
}

// FailInMemoryWrite makes the n-th entry written from now on, counted
// across all tables of lb (which must come from NewInMemory), fail with
// err; n = 0 clears it. Tests use it to check what a failed write leaves.
func (lb *LB) FailInMemoryWrite(n int, err error) {
	t := lb.services.(trackedTable[bpf.KprSvcKey, bpf.KprSvcValue]).table.(*memTable[bpf.KprSvcKey, bpf.KprSvcValue])
	t.fault.writes, t.fault.failAt, t.fault.err = 0, n, err
}

// writeFault is a write failure shared by the tables of one in-memory LB.
type writeFault struct {
	writes, failAt int
	err            error
}

func (f *writeFault) tick() error {
	if f == nil || f.failAt == 0 {
		return nil
	}
	f.writes++
	if f.writes < f.failAt {
		return nil
	}
	f.failAt = 0
	return f.err
}

// memTable is an in-memory map. Tests hook check, called after every single
// entry written or deleted, to catch an ordering that a concurrent BPF
// lookup could observe half-done, and failAt to inject write failures.
type memTable[K comparable, V any] struct {
	data    map[K]V
	max     int
	check   func()
	writes  int
	failAt  int // fail the failAt-th write from now on (0 = never)
	failErr error
	fault   *writeFault // FailInMemoryWrite's, shared by the LB's tables
}

func newMemTable[K comparable, V any](max int) *memTable[K, V] {
	return &memTable[K, V]{data: map[K]V{}, max: max}
}

func (t *memTable[K, V]) setFail(n int, err error) { t.writes, t.failAt, t.failErr = 0, n, err }

func (t *memTable[K, V]) tick() error {
	if err := t.fault.tick(); err != nil {
		return err
	}
	t.writes++
	if t.failAt != 0 && t.writes >= t.failAt {
		t.failAt = 0
		return t.failErr
	}
	return nil
}

func (t *memTable[K, V]) put(keys []K, values []V) error {
	for i := range keys {
		if err := t.tick(); err != nil {
			return err
		}
		if _, ok := t.data[keys[i]]; !ok && len(t.data) >= t.max {
			return errors.New("E2BIG: in-memory map full")
		}
		t.data[keys[i]] = values[i]
		if t.check != nil {
			t.check()
		}
	}
	return nil
}

func (t *memTable[K, V]) delete(keys []K) error {
	for _, k := range keys {
		delete(t.data, k)
		if t.check != nil {
			t.check()
		}
	}
	return nil
}

func (t *memTable[K, V]) dump(fn func(K, V)) error {
	for k, v := range t.data {
		fn(k, v)
	}
	return nil
}

func (t *memTable[K, V]) maxEntries() int { return t.max }

// scan reports the entries present at its start that are still there when
// their turn comes, with their value then: like the kernel's bucket-wise
// batch reads, an entry nobody writes is reported exactly once.
func (t *memTable[K, V]) scan(fn func(K, V)) scanCursor {
	keys := make([]K, 0, len(t.data))
	for k := range t.data {
		keys = append(keys, k)
	}
	return &memScan[K, V]{t: t, fn: fn, keys: keys}
}

type memScan[K comparable, V any] struct {
	t    *memTable[K, V]
	fn   func(K, V)
	keys []K
}

func (c *memScan[K, V]) next(max int) (bool, error) {
	n := min(max, len(c.keys))
	for _, k := range c.keys[:n] {
		if v, ok := c.t.data[k]; ok {
			c.fn(k, v)
		}
	}
	c.keys = c.keys[n:]
	return len(c.keys) == 0, nil
}
