package namedns

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
)

// ForTest creates an empty named network namespace, prefix followed by
// random hex, for a test, and deletes it when the test ends. It returns
// the name.
func ForTest(t testing.TB, prefix string) string {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := prefix + hex.EncodeToString(suffix)
	h, err := Create(name)
	if err != nil {
		t.Fatalf("create network namespace %s: %v", name, err)
	}
	h.Close()
	t.Cleanup(func() {
		if err := Delete(name); err != nil {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	return name
}
