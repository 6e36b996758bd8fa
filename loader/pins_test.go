package loader

import (
	"path/filepath"
	"testing"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane/leftovers"
)

// Removing the eBPF mode's pins counts them, and finds nothing where
// nothing is pinned: the mode switch logs, and kpr cleanup prints, only
// what went (TestCleanupSaysWhatItRemoved has the count of one pin).
func TestRemoveLeftoversFindsNothingWhereNothingIsPinned(t *testing.T) {
	got, err := RemoveLeftovers(filepath.Join(t.TempDir(), "none"))
	if err != nil || got != (leftovers.Removed{}) {
		t.Errorf("no pins: %+v, %v; want nothing found", got, err)
	}
}

// Every object must declare each pinned map as the hooks' object does
// (bpf/maps.h): the loader hands the other objects the maps the hooks were
// loaded with, and the kernel would refuse one of another shape.
func TestObjectsAgreeOnTheirPinnedMaps(t *testing.T) {
	hooks, err := bpf.LoadKpr()
	if err != nil {
		t.Fatal(err)
	}
	for _, load := range objects {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range pinnedIn(spec) {
			want, got := hooks.Maps[name], spec.Maps[name]
			if want == nil {
				t.Errorf("pinned map %s is not in the hooks' object: define it in bpf/maps.h", name)
				continue
			}
			if got.Type != want.Type || got.KeySize != want.KeySize || got.ValueSize != want.ValueSize ||
				got.MaxEntries != want.MaxEntries || got.Flags != want.Flags ||
				layout(got.Key) != layout(want.Key) || layout(got.Value) != layout(want.Value) {
				t.Errorf("pinned map %s differs between objects: %+v vs the hooks' %+v", name, got, want)
			}
		}
	}
	names, err := pinnedMapNames()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(pinnedIn(hooks)) {
		t.Errorf("pinned maps %v, the hooks' object pins %v", names, pinnedIn(hooks))
	}
}
