package harness

import (
	"sync/atomic"
	"time"
)

// ChurnWindow decides how long a churn test keeps connecting while a
// writer changes the rules: at least Min, then on until the writer has
// made MinWrites writes, for at most Max. A fast host stops after Min; a
// slow one (the kernel-matrix VMs under TCG commit a few restores a
// second) keeps going until the test has seen the flips it needs, rather
// than failing for want of them.
type ChurnWindow struct {
	Min, Max  time.Duration
	MinWrites int64

	start time.Time
}

// Start begins the window; call it when the writer starts.
func (w *ChurnWindow) Start() { w.start = time.Now() }

// Open reports whether the test should keep connecting, given the
// writes made so far.
func (w *ChurnWindow) Open(writes *atomic.Int64) bool {
	elapsed := time.Since(w.start)
	if elapsed < w.Min {
		return true
	}
	return writes.Load() < w.MinWrites && elapsed < w.Max
}
