package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
)

// ConntrackCounter counts the entries of a kpr_conntrack map, for the
// metrics. The kernel keeps no count of an LRU hash map's entries, so it
// reads them all: with batch lookups of countChunk entries into buffers it
// keeps between counts, a full map of the default 131,072 entries takes 32
// syscalls and no allocation, where one lookup per key would take 131,072.
// It is not safe for concurrent use.
type ConntrackCounter struct {
	m       *ebpf.Map
	keys    []bpf.KprCtKey
	values  []bpf.KprCtValue
	noBatch bool
}

// countChunk is the entries read per batch: 4096 × 96 bytes stay well
// inside one syscall's reasonable copy.
const countChunk = 4096

// NewConntrackCounter counts m's entries.
func NewConntrackCounter(m *ebpf.Map) *ConntrackCounter {
	return &ConntrackCounter{m: m}
}

// MaxEntries is the map's capacity.
func (c *ConntrackCounter) MaxEntries() int { return int(c.m.MaxEntries()) }

// Count returns the number of entries (two per flow). The programs write
// the map while it is read, so the count is a sample, not a snapshot.
func (c *ConntrackCounter) Count() (int, error) {
	if !c.noBatch {
		n, err := c.countBatch()
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return n, err
		}
		c.noBatch = true
	}
	return c.countIterate()
}

func (c *ConntrackCounter) countBatch() (int, error) {
	if c.keys == nil {
		c.keys, c.values = make([]bpf.KprCtKey, countChunk), make([]bpf.KprCtValue, countChunk)
	}
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := c.m.BatchLookup(&cursor, c.keys, c.values, nil)
		total += n
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return total, nil
		case errors.Is(err, unix.ENOSPC) && n == 0:
			// One hash bucket holds more entries than the buffers.
			c.keys, c.values = make([]bpf.KprCtKey, 2*len(c.keys)), make([]bpf.KprCtValue, 2*len(c.values))
		case err != nil:
			return total, fmt.Errorf("count conntrack entries: %w", err)
		}
	}
}

func (c *ConntrackCounter) countIterate() (int, error) {
	var k bpf.KprCtKey
	var v bpf.KprCtValue
	total := 0
	it := c.m.Iterate()
	for it.Next(&k, &v) {
		total++
	}
	// A walk the programs' writes abort still counted what it saw.
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return total, fmt.Errorf("count conntrack entries: %w", err)
	}
	return total, nil
}
