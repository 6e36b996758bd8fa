package harness

import "time"

// ChurnWindow decides how long a churn test keeps connecting while a
// writer changes the rules: at least Min, then on until the writer has
// done enough (the test's own measure: writes made, Services flipped),
// for at most Max. A fast host stops after Min; a slow one (the
// kernel-matrix VMs under TCG commit a few restores a second) keeps
// going until the test has seen the churn it needs, rather than failing
// for want of it.
type ChurnWindow struct {
	Min, Max time.Duration

	start time.Time
}

// Start begins the window; call it when the writer starts.
func (w *ChurnWindow) Start() { w.start = time.Now() }

// Open reports whether the test should keep connecting, given whether
// the writer has done enough yet.
func (w *ChurnWindow) Open(enough bool) bool {
	elapsed := time.Since(w.start)
	return elapsed < w.Min || (!enough && elapsed < w.Max)
}

// Started is when Start was called.
func (w *ChurnWindow) Started() time.Time { return w.start }
