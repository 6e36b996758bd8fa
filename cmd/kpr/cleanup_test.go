package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/dataplane/bpffs"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/namedns"
)

// kpr cleanup says what it removed, and "nothing to remove" where it
// found nothing (before, it said it removed the pins whether or not there
// were any). It is pointed at a directory of its own under /sys/fs/bpf
// holding one pinned map, a network namespace and a cgroup of its own:
// nothing of the host's is changed.
func TestCleanupSaysWhatItRemoved(t *testing.T) {
	requireRoot(t, "pins a map under /sys/fs/bpf and creates a network namespace and a cgroup")
	// A fresh machine has no bpffs at /sys/fs/bpf until kpr (or another
	// test) mounts one, as kpr does on a node; this test may run first.
	if err := bpffs.Ensure("/sys/fs/bpf/kpr-cleanup-test"); err != nil {
		t.Fatal(err)
	}
	bpfRoot := privateDir(t, "/sys/fs/bpf")
	cgroupRoot, err := loader.FindCgroup2Mount()
	if err != nil || cgroupRoot == "" {
		t.Skipf("skipping: no cgroup2 mount (%v)", err)
	}
	args := []string{"cleanup", "--bpf-root", bpfRoot, "--cgroup-root", privateDir(t, cgroupRoot),
		"--host-netns", namedns.Path(namedns.ForTest(t, "kpr-cleanup-test-"))}

	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pin := filepath.Join(bpfRoot, "kpr_services")
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := runKpr(t, args...)
	if want := "removed kpr's eBPF dataplane pinned under " + bpfRoot + " (pins removed: 1)"; code != exitOK || !strings.Contains(out, want) || strings.Contains(out, "nothing to remove") {
		t.Errorf("with a pinned map: exit %d, want 0 and %q:\n%s%s", code, want, out, errOut)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pin is still there: %v", err)
	}
	out, errOut, code = runKpr(t, args...)
	if code != exitOK || !strings.Contains(out, "nothing to remove: kpr left no state under "+bpfRoot) || strings.Contains(out, "removed") {
		t.Errorf("with nothing left: exit %d, want 0 and \"nothing to remove\":\n%s%s", code, out, errOut)
	}
}

// privateDir makes a directory of the test's own under parent, removed
// with all it holds when the test ends.
func privateDir(t *testing.T, parent string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, "kpr-cleanup-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A cgroup directory goes with rmdir, not by removing its files.
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			_ = os.RemoveAll(dir)
		}
	})
	return dir
}
