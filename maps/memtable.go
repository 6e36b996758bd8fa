package maps

import (
	"errors"

	"github.com/kpr-io/kpr/bpf"
)

// NewInMemory returns an LB over in-memory tables of the given sizes. It
// behaves like the BPF-backed one, without a kernel, for tests of code that
// drives an LB.
func NewInMemory(services, backends, revNats int) *LB {
	lb, err := newLB(tables{
		services:      newMemTable[bpf.KprSvcKey, bpf.KprSvcValue](services),
		backends:      newMemTable[uint32, bpf.KprBackend](backends),
		revNat:        newMemTable[uint32, bpf.KprRevNatValue](revNats),
		affinityMatch: newMemTable[bpf.KprAffinityMatchKey, uint8](services),
	}, false)
	if err != nil {
		panic("maps: empty in-memory tables cannot fail to load: " + err.Error())
	}
	return lb
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
}

func newMemTable[K comparable, V any](max int) *memTable[K, V] {
	return &memTable[K, V]{data: map[K]V{}, max: max}
}

func (t *memTable[K, V]) setFail(n int, err error) { t.writes, t.failAt, t.failErr = 0, n, err }

func (t *memTable[K, V]) tick() error {
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
