package main

import (
	"os"
	"testing"
)

// runMainEnv makes the test binary run kpr's main instead of the tests,
// so that a test can run kpr in another process, as another user
// (TestUnprivilegedCommandsSayTheyNeedRoot).
const runMainEnv = "KPR_TEST_RUN_MAIN"

// requireRoot skips a test that needs root (why says for what) when not
// root, and under -short, as `make unit` runs the tests that need neither
// root nor an API server.
func requireRoot(t *testing.T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("skipping under -short: %s, which needs root", why)
	}
	if os.Geteuid() != 0 {
		t.Skipf("skipping: %s, which needs root; run `sudo go test` (or as root)", why)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) != "" {
		main() // exits
	}
	os.Exit(m.Run())
}
