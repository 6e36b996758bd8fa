package syncperf

import (
	"slices"
	"testing"
	"time"
)

// TestLogParsingReadsKprJSON: the measurements read kpr's JSON lines as
// kpr writes them (Kubernetes components' format: ts in milliseconds since
// the epoch, durations as Go prints them).
func TestLogParsingReadsKprJSON(t *testing.T) {
	log := `{"ts":1765059382123.5,"caller":"watcher/runner.go:270","msg":"Synced the dataplane","v":0,"full":true,"took":"1.5ms"}
not JSON: a panic, say
{"ts":1765059382130,"caller":"watcher/runner.go:191","msg":"Periodic full reconcile done in steps","v":4,"longestStep":"250µs"}
`
	lines := parseLogLines(log)
	if len(lines) != 2 {
		t.Fatalf("%d lines read, want 2", len(lines))
	}
	if want := time.UnixMilli(1765059382123).Add(500 * time.Microsecond); !lines[0].At.Equal(want) {
		t.Errorf("ts read as %v, want %v", lines[0].At, want)
	}
	if got := FullSyncDurations(log); !slices.Equal(got, []time.Duration{1500 * time.Microsecond}) {
		t.Errorf("FullSyncDurations = %v, want [1.5ms]", got)
	}
	if got := LongestReconcileSteps(log); !slices.Equal(got, []time.Duration{250 * time.Microsecond}) {
		t.Errorf("LongestReconcileSteps = %v, want [250µs]", got)
	}
}
