package bpffs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEnsureMountsABPFFSWhereThereIsNone checks, in a mount namespace of
// its own, that Ensure mounts a bpffs on the parent of a path that lies on
// another filesystem (as /sys/fs/bpf on a fresh node lies on sysfs), and
// mounts nothing more when called again.
func TestEnsureMountsABPFFSWhereThereIsNone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it mounts a tmpfs and a bpffs in a mount namespace of its own")
	}
	dir := t.TempDir()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and its
		// mount namespace with it.
		runtime.LockOSThread()
		errc <- ensureInOwnMountNS(dir)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func ensureInOwnMountNS(dir string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		return err
	}
	path := filepath.Join(dir, "bpf", "kpr")
	if on, err := On(path); err != nil || on {
		return errors.Join(err, errors.New("a path on tmpfs is taken for one on bpffs"))
	}
	for range 2 {
		if err := Ensure(path); err != nil {
			return err
		}
	}
	if on, err := On(path); err != nil || !on {
		return errors.Join(err, errors.New("after Ensure the path is still not on a bpffs"))
	}
	mounts, err := os.ReadFile("/proc/thread-self/mounts")
	if err != nil {
		return err
	}
	if n := strings.Count(string(mounts), " "+filepath.Join(dir, "bpf")+" bpf "); n != 1 {
		return fmt.Errorf("want one bpffs at %s, found %d:\n%s", filepath.Join(dir, "bpf"), n, mounts)
	}
	return nil
}
