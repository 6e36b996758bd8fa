package maglev

import (
	"fmt"
	"math/rand"
	"testing"
)

func backends(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.1.%d.%d:8080", i/200, i%200+1)
	}
	return out
}

// testSeed stands for a cluster's seed.
const testSeed = 0x6b70722d73656564

func mustBuild(t *testing.T, ids []string, m uint32) []int {
	t.Helper()
	return mustBuildSeeded(t, ids, m, testSeed)
}

func mustBuildSeeded(t *testing.T, ids []string, m uint32, seed uint64) []int {
	t.Helper()
	table, err := Build(ids, m, seed)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// names maps a table of indices to the identities they stand for.
func names(table []int, ids []string) []string {
	out := make([]string, len(table))
	for i, b := range table {
		out[i] = ids[b]
	}
	return out
}

// The same backends give the same table on every node, in whatever order
// each node lists them.
func TestSameTableWhateverTheOrder(t *testing.T) {
	ids := backends(10)
	want := names(mustBuild(t, ids, DefaultTableSize), ids)
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 5; round++ {
		shuffled := append([]string(nil), ids...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got := names(mustBuild(t, shuffled, DefaultTableSize), shuffled)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("order %v: slot %d is %s, want %s", shuffled, i, got[i], want[i])
			}
		}
	}
}

// Nodes running different kpr versions must agree too: the table of a
// fixed input (and seed) is pinned here. A change of the hash or of the
// population order breaks this test, and with it flows during a rolling
// upgrade. (The seed's arrival changed it once: docs/tc-dataplane.md.)
func TestTableIsStableAcrossVersions(t *testing.T) {
	ids := []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}
	got := names(mustBuild(t, ids, 251), ids)
	want := []string{"10.0.0.1:80", "10.0.0.3:80", "10.0.0.3:80", "10.0.0.1:80", "10.0.0.3:80", "10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("first slots %v, want %v", got[:len(want)], want)
		}
	}
}

// The seed is the cluster's secret: two nodes with the same seed build the
// same table, and another seed gives another table, so that an outsider
// who knows the backends still cannot tell which slot names which.
func TestTableDependsOnSeed(t *testing.T) {
	ids := backends(10)
	a := mustBuildSeeded(t, ids, DefaultTableSize, 1)
	again := mustBuildSeeded(t, ids, DefaultTableSize, 1)
	other := mustBuildSeeded(t, ids, DefaultTableSize, 2)
	same, differ := 0, 0
	for i := range a {
		if a[i] == again[i] {
			same++
		}
		if a[i] != other[i] {
			differ++
		}
	}
	if same != len(a) {
		t.Errorf("the same seed gave tables that differ in %d of %d slots", len(a)-same, len(a))
	}
	// Two unrelated tables of 10 backends agree in about a tenth of the
	// slots.
	if differ < len(a)*8/10 {
		t.Errorf("seeds 1 and 2 gave tables that differ in only %d of %d slots", differ, len(a))
	}
	shares := Shares(other, len(ids))
	for b, n := range shares {
		if n < len(a)/len(ids) || n > len(a)/len(ids)+1 {
			t.Errorf("seed 2: backend %d has %d slots of %d", b, n, len(a))
		}
	}
}

// Every backend gets floor(M/N) or ceil(M/N) slots.
func TestSharesAreEven(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 97, 163} {
		ids := backends(n)
		shares := Shares(mustBuild(t, ids, DefaultTableSize), n)
		lo, hi := DefaultTableSize/n, (DefaultTableSize+n-1)/n
		for i, s := range shares {
			if s < lo || s > hi {
				t.Errorf("%d backends: backend %d has %d slots, want %d..%d", n, i, s, lo, hi)
			}
		}
	}
}

// Removing one of 10 backends moves its own tenth of the slots and few
// others: at most 15 % of all slots change, whichever backend leaves.
func TestRemovingOneOfTenMovesFewSlots(t *testing.T) {
	for _, m := range []uint32{DefaultTableSize, 1021} {
		ids := backends(10)
		before := names(mustBuild(t, ids, m), ids)
		for gone := range ids {
			rest := append(append([]string(nil), ids[:gone]...), ids[gone+1:]...)
			after := names(mustBuild(t, rest, m), rest)
			moved := 0
			for i := range before {
				if before[i] != after[i] {
					moved++
				}
			}
			frac := float64(moved) / float64(m)
			t.Logf("M=%d, removing %s moved %.1f%%", m, ids[gone], 100*frac)
			if frac > 0.15 {
				t.Errorf("M=%d, removing %s moved %.1f%% of the slots, want at most 15%%", m, ids[gone], 100*frac)
			}
			// Slots of a staying backend stay with it, but for a few.
			for i := range before {
				if before[i] != ids[gone] && after[i] == ids[gone] {
					t.Fatalf("slot %d went to the removed backend", i)
				}
			}
		}
	}
}

func TestValidateTableSize(t *testing.T) {
	for _, m := range []uint32{MinTableSize, 4093, DefaultTableSize, 65521, MaxTableSize} {
		if err := ValidateTableSize(m); err != nil {
			t.Errorf("%d: %v", m, err)
		}
	}
	for _, m := range []uint32{0, 2, 250, 16383, 16384, 65536, MaxTableSize + 2} {
		if err := ValidateTableSize(m); err == nil {
			t.Errorf("%d: accepted", m)
		}
	}
}

func TestBuildRefuses(t *testing.T) {
	if _, err := Build(backends(300), 251, testSeed); err == nil {
		t.Error("300 backends in 251 slots: accepted")
	}
	if _, err := Build([]string{"a", "b", "a"}, 251, testSeed); err == nil {
		t.Error("a backend listed twice: accepted")
	}
	if table, err := Build(nil, 251, testSeed); err != nil || table != nil {
		t.Errorf("no backends: %v, %v; want a nil table", table, err)
	}
}
