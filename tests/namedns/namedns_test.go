package namedns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// childEnv marks the re-executed test binary that runs in a private mount
// namespace; its value is the parent's mount namespace, so the child can
// check it really left it before it mounts anything.
const childEnv = "KPR_NAMEDNS_TEST_PARENT_MNTNS"

// inPrivateMountNS returns true in a copy of the test binary that runs only
// the calling test, in a mount namespace of its own where / is private, so
// no mount it makes (a tmpfs over /run, namespace files) reaches the host.
// In the calling process it runs that copy, reports its outcome and returns
// false.
func inPrivateMountNS(t *testing.T) bool {
	t.Helper()
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root: mounts in a private mount namespace and creates network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip, whose `ip netns add` this test races against: install iproute2")
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	if parent := os.Getenv(childEnv); parent != "" {
		if parent == self {
			t.Fatalf("child still runs in the parent's mount namespace %s; refusing to mount over /run", self)
		}
		// Go already made / private after the unshare; repeat it so the
		// test does not depend on that.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Fatalf("make / rprivate: %v", err)
		}
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+self)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("child in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("child failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("child did not report PASS for %s", t.Name())
	}
	return false
}

// freshRun mounts an empty tmpfs over /run (in the private mount namespace)
// and makes /run/netns a plain directory in it, no mount point, as on a
// machine where no `ip netns add` ever ran. It returns the tmpfs's mount ID.
func freshRun(t *testing.T) uint64 {
	t.Helper()
	if err := unix.Mount("kpr-namedns-test", "/run", "tmpfs", 0, "mode=0755,size=1m"); err != nil {
		t.Fatalf("mount tmpfs on /run: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount("/run", unix.MNT_DETACH) })
	if err := os.Mkdir(Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run, err := mountID("/run")
	if err != nil {
		t.Fatal(err)
	}
	if dir, err := mountID(Dir); err != nil || dir != run {
		t.Fatalf("%s should be a plain directory on the fresh /run (mount %d), got mount %d (%v)", Dir, run, dir, err)
	}
	return run
}

// mountsUnder lists the mounts whose mount point lies inside Dir and that
// hang, through any number of layers, below mount root. Copies of the
// host's mounts that the private mount namespace inherited under the old
// /run are not below root and so are not counted.
func mountsUnder(t *testing.T, root uint64) []mountInfo {
	t.Helper()
	mounts, err := readMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, m := range mounts {
		parent[m.id] = m.parent
	}
	below := func(id int) bool {
		for range len(mounts) {
			p, ok := parent[id]
			if !ok {
				return false
			}
			if uint64(p) == root {
				return true
			}
			id = p
		}
		return false
	}
	var out []mountInfo
	for _, m := range mounts {
		if strings.HasPrefix(m.point, Dir+"/") && below(m.id) {
			out = append(out, m)
		}
	}
	return out
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// TestCreateDeleteAlongsideIproute2 starts from a /run/netns that is not a
// mount point, creates namespaces with Create and with `ip netns add` at the
// same time, deletes them all (with Delete, and some with `ip netns delete`)
// and checks that no namespace file or mount is left. Before this package,
// the harness's namespaces made before the first `ip netns add` ended up
// hidden under iproute2's bind mount of /run/netns, and their deletion failed
// with EBUSY ("projectFirst" below).
func TestCreateDeleteAlongsideIproute2(t *testing.T) {
	if !inPrivateMountNS(t) {
		return
	}
	const each = 6
	for _, first := range []string{"projectFirst", "iproute2First", "together"} {
		t.Run(first, func(t *testing.T) {
			run := freshRun(t)
			var ours, theirs []string
			switch first {
			case "projectFirst":
				h, err := Create("kpr-p-first")
				if err != nil {
					t.Fatal(err)
				}
				h.Close()
				ours = append(ours, "kpr-p-first")
			case "iproute2First":
				if err := ipCmd("netns", "add", "kpr-i-first"); err != nil {
					t.Fatal(err)
				}
				theirs = append(theirs, "kpr-i-first")
			}

			// Both ways at once: every creator waits for the start signal.
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 2*each)
			inodes := make(chan [2]uint64, each)
			for i := range each {
				ourName, theirName := fmt.Sprintf("kpr-p-%d", i), fmt.Sprintf("kpr-i-%d", i)
				ours, theirs = append(ours, ourName), append(theirs, theirName)
				wg.Add(2)
				go func() {
					defer wg.Done()
					<-start
					h, err := Create(ourName)
					if err != nil {
						errs <- err
						return
					}
					defer h.Close()
					var hs, ps unix.Stat_t
					if err := errors.Join(unix.Fstat(int(h), &hs), unix.Stat(Path(ourName), &ps)); err != nil {
						errs <- err
						return
					}
					inodes <- [2]uint64{hs.Ino, ps.Ino}
				}()
				go func() {
					defer wg.Done()
					<-start
					if err := ipCmd("netns", "add", theirName); err != nil {
						errs <- err
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			close(inodes)
			for err := range errs {
				t.Error(err)
			}
			for ino := range inodes {
				if ino[0] != ino[1] {
					t.Errorf("Create's handle is netns inode %d, but its file pins %d", ino[0], ino[1])
				}
			}
			// Any stacking iproute2 did must be harmless: every name is
			// reachable and pins a namespace.
			for _, name := range append(append([]string{}, ours...), theirs...) {
				h, err := netns.GetFromPath(Path(name))
				if err != nil {
					t.Errorf("open %s: %v", Path(name), err)
					continue
				}
				h.Close()
			}

			var delWG sync.WaitGroup
			delErrs := make(chan error, len(ours)+len(theirs))
			for i, name := range append(append([]string{}, ours...), theirs...) {
				delWG.Add(1)
				go func() {
					defer delWG.Done()
					if i >= len(ours) && i%2 == 0 {
						delErrs <- ipCmd("netns", "delete", name)
						return
					}
					delErrs <- Delete(name)
				}()
			}
			delWG.Wait()
			close(delErrs)
			for err := range delErrs {
				if err != nil {
					t.Error(err)
				}
			}

			left, err := os.ReadDir(Dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range left {
				t.Errorf("leaked namespace file %s", filepath.Join(Dir, e.Name()))
			}
			for _, m := range mountsUnder(t, run) {
				t.Errorf("leaked mount %d (%s %s) on %s", m.id, m.fstype, m.root, m.point)
			}
		})
	}
}

// TestDeleteExplainsHiddenMount builds the leak the old harness produced (a
// namespace mounted on the plain directory, then /run/netns bound over
// itself) and checks that Delete refuses with an error that names the
// hidden mount and the way out, rather than a bare EBUSY.
func TestDeleteExplainsHiddenMount(t *testing.T) {
	if !inPrivateMountNS(t) {
		return
	}
	freshRun(t)
	const name = "kpr-hidden"
	if err := os.WriteFile(Path(name), nil, 0); err != nil {
		t.Fatal(err)
	}
	// Any nsfs file will do; the test's own netns keeps the test simple.
	if err := unix.Mount("/proc/self/ns/net", Path(name), "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}

	err := Delete(name)
	if err == nil {
		t.Fatal("Delete succeeded although the namespace is still mounted underneath a bind mount of " + Dir)
	}
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("Delete error %q does not wrap EBUSY", err)
	}
	for _, want := range []string{Path(name), "nsfs", "hides", "umount " + Dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Delete error %q does not mention %q", err, want)
		}
	}

	// The way out the error gives works.
	if err := unix.Unmount(Dir, 0); err != nil {
		t.Fatalf("umount %s: %v", Dir, err)
	}
	if err := Delete(name); err != nil {
		t.Fatalf("Delete after removing the upper layer: %v", err)
	}
}
