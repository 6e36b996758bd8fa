// Package namedns is the project's one way to create and delete named network
// namespaces (/run/netns/NAME, as `ip netns` shows them). The test harness,
// the test cluster and their tests all go through it, and none of them runs
// `ip netns add` or `ip netns delete`.
//
// Why it exists: a named namespace is an nsfs bind mount on a file under
// /run/netns. The first time `ip netns add` runs on a machine it finds
// /run/netns is not a mount point, and bind-mounts the directory onto itself
// (recursively) before making it shared. A namespace that something else had
// mounted on the plain directory before that moment stays mounted in the
// lower layer, hidden: unmounting /run/netns/NAME then reaches only the upper
// copy, and the unlink fails with EBUSY, so the namespace leaks. This happened
// to `make test` on every fresh machine (tests/cluster ran `ip netns add`
// while the harness's packages ran in parallel).
//
// Create therefore first makes /run/netns a shared mount point exactly as
// iproute2 would (serialised across processes with a flock on the
// directory), so iproute2, whenever it runs later, finds a mount point and
// adds no layer. Mounts then made in any stacked layer propagate between the
// layers, which are peers, and so do their unmounts. Delete unmounts and
// unlinks, and when it cannot, says which mount holds the file.
package namedns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir is where named network namespaces are pinned, as iproute2 and
// `nsenter --net=/run/netns/NAME` expect them.
const Dir = "/run/netns"

// Path returns the file that pins the namespace called name.
func Path(name string) string { return filepath.Join(Dir, name) }

// Create makes a new network namespace pinned at Path(name) and returns an
// open handle to it, which the caller closes. The calling thread's namespace
// is not changed: the unshare happens on a throw-away locked thread. The name
// must not exist yet. lo in the new namespace is down.
func Create(name string) (netns.NsHandle, error) {
	if err := checkName(name); err != nil {
		return netns.None(), err
	}
	if err := EnsureMountPoint(); err != nil {
		return netns.None(), err
	}
	path := Path(name)
	// O_EXCL: two creators of one name must not share a namespace. Mode 0
	// as iproute2 uses: the file is only a mount point.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return netns.None(), fmt.Errorf("create netns %s: %s already exists (pick another name, or delete the old one first)", name, path)
		}
		return netns.None(), fmt.Errorf("create netns file %s: %w", path, err)
	}
	_ = f.Close()

	err = onLockedThread(func() (tainted bool, err error) {
		orig, err := netns.Get()
		if err != nil {
			return false, fmt.Errorf("get the thread's netns: %w", err)
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("unshare a new netns: %w", err)
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		var mountErr error
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			mountErr = fmt.Errorf("bind-mount %s on %s: %w", self, path, err)
		}
		if err := netns.Set(orig); err != nil {
			return true, errors.Join(mountErr, fmt.Errorf("return to the original netns: %w", err))
		}
		return false, mountErr
	})
	if err != nil {
		return netns.None(), errors.Join(fmt.Errorf("create netns %s: %w", name, err), Delete(name))
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), errors.Join(fmt.Errorf("open netns %s: %w", path, err), Delete(name))
	}
	return h, nil
}

// EnsureMountPoint makes Dir a mount point with shared propagation, the state
// `ip netns add` leaves it in: mkdir, then MS_SHARED|MS_REC, and only if that
// fails with EINVAL (not a mount point) bind-mount Dir onto itself and retry.
// An exclusive flock on the directory serialises this between processes that
// use this package; iproute2 takes no lock, but once Dir is a mount point it
// only repeats the (idempotent) MS_SHARED and adds no layer. It is cheap when
// Dir is already a shared mount point, so Create calls it every time: someone
// may have unmounted Dir since.
func EnsureMountPoint() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", Dir, err)
	}
	d, err := os.Open(Dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", Dir, err)
	}
	defer d.Close() // releases the flock
	// The bind mount below is the same directory inode, so the lock covers
	// processes that open Dir before and after it.
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", Dir, err)
	}
	for bound := false; ; bound = true {
		err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("make %s a shared mount (mount --make-rshared %s): %w", Dir, Dir, err)
		}
		if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("make %s a mount point (mount --rbind %s %s): %w", Dir, Dir, Dir, err)
		}
	}
}

// maxStacked bounds the unmount loop in Delete: a name mounted more than this
// many times over is not something this package makes.
const maxStacked = 16

// Delete unmounts and removes Path(name). The kernel frees the namespace once
// no process runs in it and no fd or socket refers to it. Deleting a name
// that does not exist is not an error. When the file cannot be removed, the
// error says which mount still holds it and how to remove it by hand.
func Delete(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	path := Path(name)
	// Detach every mount stacked on the path; each unmount propagates to
	// the peers of a shared /run/netns.
	for i := 0; ; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if err == nil {
			if i >= maxStacked {
				return fmt.Errorf("unmount netns %s: still a mount point after %d unmounts", path, maxStacked)
			}
			continue
		}
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.EINVAL) { // not (or no longer) a mount point
			break
		}
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := unix.Unlink(path); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove netns file %s: %w: %s", path, err, explainBusy(path))
		}
		return fmt.Errorf("remove netns file %s: %w", path, err)
	}
	return nil
}

// explainBusy says why path, which is no longer a mount point as seen through
// its path, still cannot be unlinked: the kernel refuses while any mount of
// this mount namespace sits on the file, and such a mount is then hidden
// under another mount of Dir.
func explainBusy(path string) string {
	mounts, err := readMountInfo()
	if err != nil {
		return fmt.Sprintf("a hidden mount still sits on it (%v)", err)
	}
	var on, layers []mountInfo
	for _, m := range mounts {
		switch m.point {
		case path:
			on = append(on, m)
		case Dir:
			layers = append(layers, m)
		}
	}
	if len(on) == 0 {
		return "a mount of this mount namespace still sits on it, but /proc/self/mountinfo shows none at that path " +
			"(its mount point may be hidden by an overmount of a parent directory)"
	}
	var b strings.Builder
	for i, m := range on {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "mount %d (%s %s) is still on it, in parent mount %d", m.id, m.fstype, m.root, m.parent)
	}
	// The usual cause: the mount on the file hangs off a lower mount than
	// the one Dir resolves to now, which is Dir bound over itself.
	top, err := mountID(Dir)
	hidden := err == nil && slices.ContainsFunc(layers, func(l mountInfo) bool { return uint64(l.id) == top }) &&
		slices.ContainsFunc(on, func(m mountInfo) bool { return uint64(m.parent) != top })
	if hidden {
		fmt.Fprintf(&b, ", which mount %d (%s bound over itself, e.g. by the first `ip netns add` on this machine) hides, "+
			"so unmounting %s reaches only the upper copy. To free it: `umount %s` (refused while namespaces are mounted in the upper layer), "+
			"then `umount %s && rm %s`", top, Dir, path, Dir, path, path)
	} else {
		fmt.Fprintf(&b, ", hidden by an overmount; find it with `grep %s /proc/self/mountinfo`", path)
	}
	return b.String()
}

type mountInfo struct {
	id, parent int
	root       string
	point      string
	fstype     string
}

// readMountInfo parses /proc/self/mountinfo (see proc_pid_mountinfo(5)).
func readMountInfo() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		id, err1 := strconv.Atoi(fields[0])
		parent, err2 := strconv.Atoi(fields[1])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, mountInfo{
			id: id, parent: parent,
			root:   unescapeMountInfo(fields[3]),
			point:  unescapeMountInfo(fields[4]),
			fstype: fields[sep+1],
		})
	}
	return out, sc.Err()
}

// mountID returns the ID of the mount that path resolves to (the top one
// when mounts are stacked), as /proc/self/mountinfo numbers them.
func mountID(path string) (uint64, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, fmt.Errorf("statx %s: %w", path, err)
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, fmt.Errorf("statx %s: the kernel reports no mount ID", path)
	}
	return stx.Mnt_id, nil
}

// unescapeMountInfo undoes the octal escapes (\040 for space etc.) of
// mountinfo path fields.
func unescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || len(name) > 255 {
		return fmt.Errorf("invalid netns name %q: want a plain file name", name)
	}
	return nil
}

// onLockedThread runs fn on a new goroutine locked to its OS thread. When fn
// reports the thread tainted (left in a foreign namespace), the goroutine
// exits still locked, so the runtime destroys the thread instead of reusing
// it.
func onLockedThread(fn func() (tainted bool, err error)) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tainted, err := fn()
		if !tainted {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
