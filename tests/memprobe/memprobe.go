// Package memprobe measures the live heap for the tests that keep kpr's
// in-memory state small (maps' mirror, the watcher's syncer state).
package memprobe

import "runtime"

// LiveHeap returns the bytes of heap still reachable. It collects twice:
// the first collection may leave objects that only become unreachable once
// finalizers and the sweep of the previous cycle have run.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
