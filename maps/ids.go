package maps

import "fmt"

// idAllocator hands out small integer ids (backend ids, reverse-NAT ids).
// It is rebuilt from the pinned maps on restart by reserving every id found
// there, so a restarted kpr never reuses an id the dataplane still holds.
type idAllocator struct {
	name     string
	min, max uint32
	next     uint32
	used     idSet
}

// idSet is the set of ids in use. An allocator keeps its own unless its
// owner already holds every id in use as the keys of a map of its own (as
// the LB's backendOf does for 100,000s of backends): then a second set of
// the same ids would only cost memory.
type idSet interface {
	has(id uint32) bool
	add(id uint32)
	remove(id uint32)
	len() int
}

// ownIDs is an allocator's own set of the ids in use.
type ownIDs map[uint32]struct{}

func (s ownIDs) has(id uint32) bool { _, ok := s[id]; return ok }
func (s ownIDs) add(id uint32)      { s[id] = struct{}{} }
func (s ownIDs) remove(id uint32)   { delete(s, id) }
func (s ownIDs) len() int           { return len(s) }

func newIDAllocator(name string, min, max uint32) *idAllocator {
	return newIDAllocatorOver(name, min, max, ownIDs{})
}

// newIDAllocatorOver returns an allocator over an id set the caller keeps:
// allocate's and reserve's ids must be added to it by the caller before
// the next allocate, release's removed by the caller.
func newIDAllocatorOver(name string, min, max uint32, used idSet) *idAllocator {
	return &idAllocator{name: name, min: min, max: max, next: min, used: used}
}

// allocate returns the next free id, searching upwards from the last one
// handed out and wrapping around, so freed ids are reused only late.
func (a *idAllocator) allocate() (uint32, error) {
	span := uint64(a.max-a.min) + 1
	if uint64(a.used.len()) >= span {
		return 0, fmt.Errorf("all %d %s ids are in use", span, a.name)
	}
	id := a.next
	for a.used.has(id) {
		id = a.step(id)
	}
	a.used.add(id)
	a.next = a.step(id)
	return id, nil
}

func (a *idAllocator) step(id uint32) uint32 {
	if id >= a.max {
		return a.min
	}
	return id + 1
}

// reserve marks an id found in a pinned map as taken.
func (a *idAllocator) reserve(id uint32) {
	a.used.add(id)
	if id >= a.next && id < a.max {
		a.next = id + 1
	}
}

func (a *idAllocator) release(id uint32) { a.used.remove(id) }
