// Package maglev builds Maglev lookup tables (Eisenbud et al., "Maglev: A
// Fast and Reliable Software Network Load Balancer", NSDI 2016, section
// 3.4): a table of M slots, M prime, each naming one backend, in which
// every backend holds an almost equal share of the slots and a change of
// the backend set moves few slots besides those of the backends that left.
//
// kpr's tc programs pick the backend of a new flow from outside as
// table[hash(seed, flow) % M]. The table is a function of the cluster's
// seed and the backends' identities alone (never of node-local ids or of
// the order they are given in), so every node behind one ECMP router
// builds the same table and sends a flow to the same backend whichever
// node the router picks. The seed is a secret of the cluster: without it
// an outsider could compute the table and the flow hash, and aim flows of
// his choosing at one backend.
package maglev

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sort"
)

// DefaultTableSize is the table size `kpr run` uses, as Cilium's default:
// a prime about 100 times a Service of 160 backends.
const DefaultTableSize = 16381

// MinTableSize and MaxTableSize bound the table size. The smallest keeps
// a few dozen backends evenly spread; the largest keeps a table (4 bytes a
// slot, one per Service frontend with distinct backends) at 4 MiB.
const (
	MinTableSize = 251
	MaxTableSize = 1<<20 - 3 // 1048573, the largest prime below 2^20
)

// SlotsPerBackend is how many slots per backend a table should have at
// least: the paper's M >= 100 N, under which the shares stay within a few
// percent of each other and a change moves close to the minimum.
const SlotsPerBackend = 100

// ValidateTableSize checks a table size given by the operator.
func ValidateTableSize(m uint32) error {
	if m < MinTableSize || m > MaxTableSize {
		return fmt.Errorf("maglev table size %d: give a prime from %d to %d (default %d)", m, MinTableSize, MaxTableSize, DefaultTableSize)
	}
	if !isPrime(m) {
		return fmt.Errorf("maglev table size %d is not prime: Maglev needs a prime so that every backend's permutation visits every slot; "+
			"try one of 4093, 8191, 16381, 32749, 65521, 131071", m)
	}
	return nil
}

func isPrime(n uint32) bool {
	if n < 2 {
		return false
	}
	for d := uint32(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// Build returns the table of size m for the given backend identities
// (such as "10.0.0.1:8080", the same string on every node) and the
// cluster's seed: entry i is the index into ids of the backend slot i goes
// to. ids must be distinct and m a valid table size with at least len(ids)
// slots; with no ids the table is nil.
func Build(ids []string, m uint32, seed uint64) ([]int, error) {
	if err := ValidateTableSize(m); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if uint64(len(ids)) > uint64(m) {
		return nil, fmt.Errorf("maglev table of %d slots cannot hold %d backends: raise --maglev-table-size to a prime of at least %d",
			m, len(ids), len(ids)*SlotsPerBackend)
	}
	// The population order is the identities' order, not the caller's:
	// the same backends give the same table whatever order they come in.
	order := make([]int, len(ids))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return ids[order[a]] < ids[order[b]] })
	for i := 1; i < len(order); i++ {
		if ids[order[i]] == ids[order[i-1]] {
			return nil, fmt.Errorf("maglev: backend %s is listed twice", ids[order[i]])
		}
	}

	// Backend i's preference list is offset, offset+skip, offset+2 skip,
	// ... (mod m): a permutation of the slots because m is prime and
	// 0 < skip < m.
	n := len(ids)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	next := make([]uint64, n) // how far along its list each backend is
	for i, idx := range order {
		offset[i], skip[i] = permutation(seed, ids[idx], uint64(m))
	}
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	// Each backend in turn takes the next free slot on its list, until
	// the table is full: every backend gets floor(m/n) or ceil(m/n) slots.
	filled := uint32(0)
	for {
		for i := 0; i < n; i++ {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[c] = order[i]
			next[i]++
			filled++
			if filled == m {
				return table, nil
			}
		}
	}
}

// permutation derives a backend's offset and skip from two independent
// hashes of the seed and its identity: two parts of their SHA-256, which
// is the same on every node and every kpr version.
func permutation(seed uint64, id string, m uint64) (offset, skip uint64) {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write([]byte(id))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	offset = binary.BigEndian.Uint64(sum[0:8]) % m
	skip = binary.BigEndian.Uint64(sum[8:16])%(m-1) + 1
	return offset, skip
}

// SeedOf turns the cluster's seed as text (kpr run's --maglev-hash-seed,
// or the kube-system Namespace's UID) into the 64-bit seed of the tables
// and of the tc programs' Maglev flow hash.
func SeedOf(text string) uint64 {
	sum := sha256.Sum256([]byte("kpr maglev hash seed\x00" + text))
	return binary.BigEndian.Uint64(sum[:8])
}

// Shares counts the slots of each backend index in table.
func Shares(table []int, backends int) []int {
	out := make([]int, backends)
	for _, b := range table {
		if b >= 0 && b < backends {
			out[b]++
		}
	}
	return out
}
