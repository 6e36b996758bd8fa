package harness

import (
	"os"
	"testing"
)

// RequireRoot skips the test unless it runs as root, which namespaces,
// veths, cgroups and BPF all need.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skipping: needs root to create network namespaces, interfaces and cgroups; run `sudo go test` (or as root)")
	}
}
