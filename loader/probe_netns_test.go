package loader

import (
	"os"
	"testing"

	"github.com/kpr-io/kpr/tests/harness"
)

// The clsact probe works in a network namespace of its own. Whichever
// thread runs it, the process must stay in its namespace afterwards: the
// main thread cannot be ended by the runtime, and a main thread left in
// the probe's namespace makes /proc/self/ns/net name a dead namespace, so
// that `kpr run` records its netfilter state under the wrong one.
func TestClsactProbeLeavesTheProcessInItsNamespace(t *testing.T) {
	harness.RequireRoot(t)
	want, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		if err := probeClsact(); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		if got, err := os.Readlink("/proc/self/ns/net"); err != nil || got != want {
			t.Fatalf("after probe %d the main thread is in %s (%v), want %s", i, got, err, want)
		}
	}
}
