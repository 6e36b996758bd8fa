package netnsexec

import (
	"errors"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func netnsIno(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// fn runs in the namespace it is given, and the caller's thread stays in
// its own.
func TestInRunsInTheNamespaceAndLeavesTheCallerAlone(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace (and does not run under -short)")
	}
	// A second namespace to enter: unshare one on a thread that is then
	// thrown away, keeping a descriptor of it.
	nsFd := make(chan int, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			nsFd <- -1
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Errorf("open new netns: %v", err)
		}
		nsFd <- fd
	}()
	fd := <-nsFd
	if fd < 0 {
		t.FailNow()
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := netnsIno(t, "/proc/thread-self/ns/net")
	var inside uint64
	want := errors.New("from fn")
	err := In(fd, func() error {
		inside = netnsIno(t, "/proc/thread-self/ns/net")
		return want
	})
	if !errors.Is(err, want) {
		t.Fatalf("In returned %v, want fn's error", err)
	}
	if inside != st.Ino {
		t.Errorf("fn ran in netns inode %d, want %d", inside, st.Ino)
	}
	if after := netnsIno(t, "/proc/thread-self/ns/net"); after != before {
		t.Errorf("caller's thread moved from netns %d to %d", before, after)
	}
}

func TestInPathNamesAMissingNamespace(t *testing.T) {
	err := InPath("/nonexistent/ns/net", func() error { t.Error("fn ran"); return nil })
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
}
