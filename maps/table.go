package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// table is the slice of a BPF hash map that the LB needs. The interface
// exists so that the write-ordering logic can be tested without a kernel.
type table[K comparable, V any] interface {
	// put writes entries in order; on error some prefix may be written.
	put(keys []K, values []V) error
	// delete removes entries; missing entries are not an error.
	delete(keys []K) error
	// dump calls fn for every entry.
	dump(fn func(K, V)) error
	// scan is dump a chunk at a time, with writes allowed between
	// chunks: an entry nobody writes during the scan is reported exactly
	// once, a written one at most once (see DriftScan).
	scan(fn func(K, V)) scanCursor
	maxEntries() int
}

// bpfTable adapts an *ebpf.Map, using batch syscalls where the kernel has
// them (5.6+) and one syscall per entry otherwise.
type bpfTable[K comparable, V any] struct {
	m       *ebpf.Map
	noBatch bool
}

func newBPFTable[K comparable, V any](m *ebpf.Map) *bpfTable[K, V] {
	return &bpfTable[K, V]{m: m}
}

func (t *bpfTable[K, V]) maxEntries() int { return int(t.m.MaxEntries()) }

func (t *bpfTable[K, V]) put(keys []K, values []V) error {
	if len(keys) == 0 {
		return nil
	}
	if !t.noBatch {
		_, err := t.m.BatchUpdate(keys, values, nil)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return t.wrap("update", err)
		}
		t.noBatch = true
	}
	for i := range keys {
		if err := t.m.Put(keys[i], values[i]); err != nil {
			return t.wrap("update", err)
		}
	}
	return nil
}

func (t *bpfTable[K, V]) delete(keys []K) error {
	// Batch delete stops at the first missing key, so delete one by one:
	// deletes happen only for the few entries a change removes.
	for i := range keys {
		if err := t.m.Delete(keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return t.wrap("delete", err)
		}
	}
	return nil
}

func (t *bpfTable[K, V]) dump(fn func(K, V)) error {
	if !t.noBatch {
		err := t.dumpBatch(fn)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return t.wrap("read", err)
		}
		t.noBatch = true
	}
	var k K
	var v V
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		fn(k, v)
	}
	return t.wrap("read", it.Err())
}

func (t *bpfTable[K, V]) dumpBatch(fn func(K, V)) error {
	const chunk = 4096
	keys := make([]K, chunk)
	values := make([]V, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := t.m.BatchLookup(&cursor, keys, values, nil)
		for i := 0; i < n; i++ {
			fn(keys[i], values[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (t *bpfTable[K, V]) scan(fn func(K, V)) scanCursor { return &bpfScan[K, V]{t: t, fn: fn} }

// bpfScan reads a hash map with one batch lookup per step. The kernel's
// cursor is a bucket index, so it stays valid across writes.
type bpfScan[K comparable, V any] struct {
	t      *bpfTable[K, V]
	fn     func(K, V)
	cursor ebpf.MapBatchCursor
	keys   []K
	values []V
}

func (c *bpfScan[K, V]) next(max int) (bool, error) {
	if c.t.noBatch {
		// Without batch reads the kernel's iteration restarts when the
		// current key is deleted, so read the whole map in one step.
		return true, c.t.dump(c.fn)
	}
	for {
		if len(c.keys) < max {
			c.keys, c.values = make([]K, max), make([]V, max)
		}
		n, err := c.t.m.BatchLookup(&c.cursor, c.keys[:max], c.values[:max], nil)
		for i := 0; i < n; i++ {
			c.fn(c.keys[i], c.values[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return true, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			c.t.noBatch = true
			return true, c.t.dump(c.fn)
		case errors.Is(err, unix.ENOSPC) && n == 0:
			max *= 2 // one hash bucket holds more entries than max
			continue
		}
		return false, c.t.wrap("read", err)
	}
}

func (t *bpfTable[K, V]) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	name := "?"
	if info, ierr := t.m.Info(); ierr == nil {
		name = info.Name
	}
	return fmt.Errorf("%s BPF map %s: %w", op, name, err)
}
