package harness

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSweepRemovesOnlyAbandonedObjects simulates a test process that died
// before cleanup: its namespace stays mounted but nobody holds it, its
// cgroup directory stays but is not open. Live objects must survive.
func TestSweepRemovesOnlyAbandonedObjects(t *testing.T) {
	RequireRoot(t)
	suffix := randomSuffix(6)
	live, err := newNetNS(NamePrefix + suffix + "-live")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.destroy() })
	dead, err := newNetNS(NamePrefix + suffix + "-dead")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dead.destroy() })
	// Drop every reference the "dead" process held, keeping the pin.
	dead.nl.Close()
	dead.nl = nil
	_ = dead.handle.Close()

	liveCg, err := NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	mount, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	deadCg := filepath.Join(mount, cgroupPrefix+randomSuffix(8))
	if err := os.Mkdir(deadCg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(deadCg) })

	ours := func(paths ...string) func(string) bool {
		return func(name string) bool {
			return slices.ContainsFunc(paths, func(p string) bool { return filepath.Base(p) == name })
		}
	}
	removed, err := sweep(0, ours(live.Path, dead.Path), ours(liveCg.Path, deadCg))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{dead.Path, deadCg}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("sweep removed %v, want %v", removed, want)
	}
	for _, p := range []string{live.Path, liveCg.Path} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("live object %s was swept: %v", p, err)
		}
	}
	for _, p := range want {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("abandoned object %s still exists (err %v)", p, err)
		}
	}
}

func TestSweepNamePatterns(t *testing.T) {
	for name, want := range map[string]bool{
		"kpr-0a1b2c-node":  true,
		"kpr-0a1b2c-pod-1": true,
		"kpr-demo-node":    false,
		"kpr-0a1b2c":       false,
		"other-0a1b2c-x":   false,
	} {
		if got := harnessNetNSName.MatchString(name); got != want {
			t.Errorf("netns %q swept = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{
		"kpr-test-0a1b2c3d": true,
		"kpr-test-demo":     false,
		"kpr-test-0a1b2c3":  false,
	} {
		if got := harnessCgroupName.MatchString(name); got != want {
			t.Errorf("cgroup %q swept = %v, want %v", name, got, want)
		}
	}
}
