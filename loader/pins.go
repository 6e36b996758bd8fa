package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane/leftovers"
)

// The pinned maps: which there are, opening them, removing them. The list
// is whatever the program objects declare with LIBBPF_PIN_BY_NAME
// (bpf/maps.h), never a list kept by hand.

// objects are kpr's program objects. Every map any of them pins is kpr's.
var objects = []func() (*ebpf.CollectionSpec, error){bpf.LoadKpr, bpf.LoadSockTerm, bpf.LoadTcNodeport}

// pinnedIn returns the names of the maps spec pins by name, sorted.
func pinnedIn(spec *ebpf.CollectionSpec) []string {
	var names []string
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// pinnedMapNames returns every map name any of kpr's objects pins, sorted.
func pinnedMapNames() ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, load := range objects {
		spec, err := load()
		if err != nil {
			return nil, fmt.Errorf("parse embedded BPF object: %w", err)
		}
		for _, name := range pinnedIn(spec) {
			if !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

// OpenPinnedMaps opens the maps of a running dataplane, for inspection and
// for a control plane that attaches nothing itself.
func OpenPinnedMaps(bpfRoot string) (*bpf.KprMaps, error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	spec, err := bpf.LoadKpr()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	// KprMaps holds exactly the hooks' object's pinned maps; Assign fills
	// it by name, as it does for a loaded collection.
	opened := &ebpf.Collection{Maps: map[string]*ebpf.Map{}}
	defer opened.Close()
	for _, name := range pinnedIn(spec) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, name), nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s under %s: %w (is kpr running with --bpf-root %s?)", name, bpfRoot, err, bpfRoot)
		}
		opened.Maps[name] = m
	}
	var m bpf.KprMaps
	if err := opened.Assign(&m); err != nil {
		return nil, fmt.Errorf("open pinned maps under %s: %w", bpfRoot, err)
	}
	return &m, nil
}

// Cleanup detaches every kpr program and removes every pin under bpfRoot.
// It is safe to run when nothing is loaded.
func Cleanup(bpfRoot string) error {
	_, err := removePins(bpfRoot)
	return err
}

// removePins is Cleanup, also counting the pins it removed (links and
// maps), so that `kpr cleanup` can tell removing something from finding
// nothing.
func removePins(bpfRoot string) (int, error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	removed, errs := unpinLinks(bpfRoot)
	names, err := pinnedMapNames()
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	for _, name := range names {
		for _, pin := range []string{name, carryPin(name)} {
			err := os.Remove(filepath.Join(bpfRoot, pin))
			switch {
			case err == nil:
				removed++
			case !errors.Is(err, os.ErrNotExist):
				errs = append(errs, fmt.Errorf("remove map pin: %w", err))
			}
		}
	}
	for _, dir := range []string{linkDir(bpfRoot), bpfRoot} {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
		}
	}
	return removed, errors.Join(errs...)
}

// RemoveLeftovers is the eBPF mode's part of a switch to another mode and
// of `kpr cleanup`: Cleanup. The pins are their own record of what the
// mode wrote: Found says some were there, Count how many (links and maps)
// went.
func RemoveLeftovers(bpfRoot string) (leftovers.Removed, error) {
	n, err := removePins(bpfRoot)
	if err != nil {
		return leftovers.Removed{Found: true, Count: n}, fmt.Errorf("cleanup of %s: %w", bpfRoot, err)
	}
	return leftovers.Removed{Found: n > 0, Count: n}, nil
}
