package maps

import "testing"

func TestIDAllocatorSkipsReservedAndWraps(t *testing.T) {
	a := newIDAllocator("test", 1, 4)
	a.reserve(2)
	got := []uint32{}
	for i := 0; i < 3; i++ {
		id, err := a.allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if got[0] != 3 || got[1] != 4 || got[2] != 1 {
		t.Fatalf("allocated %v, want [3 4 1]: search upwards from the highest reserved id, then wrap", got)
	}
	if _, err := a.allocate(); err == nil {
		t.Fatal("allocated from a full allocator")
	}
	a.release(4)
	if id, err := a.allocate(); err != nil || id != 4 {
		t.Fatalf("after release got %d, %v; want 4", id, err)
	}
}

func TestIDAllocatorReusesLate(t *testing.T) {
	a := newIDAllocator("test", 1, 100)
	first, _ := a.allocate()
	a.release(first)
	second, _ := a.allocate()
	if second == first {
		t.Fatal("a just-freed id was handed out again at once")
	}
}
