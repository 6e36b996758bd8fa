package harness

import (
	"os"
	"testing"
)

// RequireRoot skips the test unless it runs as root, which namespaces,
// veths, cgroups and BPF all need. Under -short (`make unit`) it skips
// always, so the unit run stays free of kernel state even as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("skipping under -short: needs root to create network namespaces, interfaces and cgroups")
	}
	if os.Geteuid() != 0 {
		tb.Skip("skipping: needs root to create network namespaces, interfaces and cgroups; run `sudo go test` (or as root)")
	}
}
