package maps

import "fmt"

// idAllocator hands out small integer ids (backend ids, reverse-NAT ids).
// It is rebuilt from the pinned maps on restart by reserving every id found
// there, so a restarted kpr never reuses an id the dataplane still holds.
type idAllocator struct {
	name     string
	min, max uint32
	next     uint32
	used     map[uint32]struct{}
}

func newIDAllocator(name string, min, max uint32) *idAllocator {
	return &idAllocator{name: name, min: min, max: max, next: min, used: map[uint32]struct{}{}}
}

// allocate returns the next free id, searching upwards from the last one
// handed out and wrapping around, so freed ids are reused only late.
func (a *idAllocator) allocate() (uint32, error) {
	span := uint64(a.max-a.min) + 1
	if uint64(len(a.used)) >= span {
		return 0, fmt.Errorf("all %d %s ids are in use", span, a.name)
	}
	id := a.next
	for {
		if _, taken := a.used[id]; !taken {
			break
		}
		id = a.step(id)
	}
	a.used[id] = struct{}{}
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
	a.used[id] = struct{}{}
	if id >= a.next && id < a.max {
		a.next = id + 1
	}
}

func (a *idAllocator) release(id uint32) { delete(a.used, id) }

func (a *idAllocator) inUse() int { return len(a.used) }
