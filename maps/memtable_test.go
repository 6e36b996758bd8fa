package maps

import (
	"reflect"
	"testing"

	"github.com/kpr-io/kpr/bpf"
)

// InMemoryMaps is every map the LB writes, and NewInMemorySized sizes
// each: the conformance suite fills the maps by these names, so a map the
// LB writes but the list lacks would never be filled.
func TestInMemoryMapsAreEveryMapTheLBWrites(t *testing.T) {
	// The LB writes its tables and the source-range map.
	if n := reflect.TypeOf(tables{}).NumField() + 1; n != len(InMemoryMaps) {
		t.Fatalf("the LB writes %d maps, InMemoryMaps lists %d", n, len(InMemoryMaps))
	}
	for _, name := range InMemoryMaps {
		lb := NewInMemorySized(map[string]int{name: 7})
		found := false
		for _, u := range append(lb.Usage(), lb.SourceRanges().Usage()) {
			if u.Map == name {
				found = true
				if u.MaxEntries != 7 {
					t.Errorf("NewInMemorySized(%s: 7) made it %d entries", name, u.MaxEntries)
				}
			} else if u.MaxEntries == 7 && !(name == bpf.KprMapKprServices && u.Map == bpf.KprMapKprAffinityMatch) {
				// (The affinity match map is sized like the service map
				// unless named, as the loader sizes it.)
				t.Errorf("NewInMemorySized(%s: 7) sized %s too", name, u.Map)
			}
		}
		if !found {
			t.Errorf("%s is not among the maps whose usage the LB reports", name)
		}
	}
}
