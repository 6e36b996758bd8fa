package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/tests/namedns"
)

// staleAfter keeps the sweep away from objects another harness is still
// creating: they are at most this young when nobody holds them yet.
const staleAfter = time.Minute

var sweepOnce sync.Once

// Only names exactly as this package makes them are swept, never other
// kpr-* namespaces or cgroups someone created by hand.
var (
	harnessNetNSName  = regexp.MustCompile(`^` + NamePrefix + `[0-9a-f]{6}-[a-z0-9-]+$`)
	harnessCgroupName = regexp.MustCompile(`^` + cgroupPrefix + `[0-9a-f]{8}$`)
)

// sweepStaleOnce runs SweepStale the first time a node or cgroup is created in
// this process, so leftovers of killed test runs do not pile up. Failures are
// not fatal: they only mean some junk stays.
func sweepStaleOnce() {
	sweepOnce.Do(func() { _, _ = SweepStale() })
}

// SweepStale deletes harness namespaces (/run/netns/kpr-<hex6>-<name>) and
// test cgroups (<cgroup2>/kpr-test-<hex8>) left behind by test processes that died before their
// cleanup ran (a -timeout panic, SIGKILL). A live harness always holds an open
// fd of each of its namespaces and cgroups, so an object is stale only when no
// process holds it or runs in it, and it is older than a minute. Returns the
// paths removed.
func SweepStale() ([]string, error) {
	return sweep(staleAfter, harnessNetNSName.MatchString, harnessCgroupName.MatchString)
}

// sweep removes the namespaces and cgroups whose base names the predicates
// accept, that are older than minAge and that nobody holds.
func sweep(minAge time.Duration, netnsName, cgroupName func(string) bool) ([]string, error) {
	held, err := heldObjects()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error

	nsPaths, _ := filepath.Glob(filepath.Join(namedns.Dir, NamePrefix+"*"))
	for _, p := range nsPaths {
		if !netnsName(filepath.Base(p)) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || !olderThan(&st, minAge) || held.netns[st.Ino] {
			continue
		}
		ns := &NetNS{Name: filepath.Base(p), Path: p}
		if err := ns.destroy(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}

	if mount, err := Cgroup2Mount(); err == nil {
		cgPaths, _ := filepath.Glob(filepath.Join(mount, cgroupPrefix+"*"))
		for _, p := range cgPaths {
			if !cgroupName(filepath.Base(p)) {
				continue
			}
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil || !olderThan(&st, minAge) || held.dirs[p] {
				continue
			}
			// rmdir fails with EBUSY while processes are inside: a cgroup
			// someone still uses is never removed.
			if err := unix.Rmdir(p); err != nil {
				if !errors.Is(err, unix.EBUSY) {
					errs = append(errs, fmt.Errorf("remove stale cgroup %s: %w", p, err))
				}
				continue
			}
			removed = append(removed, p)
		}
	}
	return removed, errors.Join(errs...)
}

func olderThan(st *unix.Stat_t, age time.Duration) bool {
	return time.Since(time.Unix(st.Ctim.Sec, st.Ctim.Nsec)) >= age
}

type heldSet struct {
	netns map[uint64]bool // inodes of network namespaces in use
	dirs  map[string]bool // directories open in some process
}

// heldObjects scans /proc for network namespaces that a task runs in or a
// process holds an fd to, and for open directories.
func heldObjects() (heldSet, error) {
	h := heldSet{netns: map[uint64]bool{}, dirs: map[string]bool{}}
	self, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return h, fmt.Errorf("stat own netns: %w", err)
	}
	nsfsDev := self.Sys().(*syscall.Stat_t).Dev
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return h, fmt.Errorf("scan /proc: %w", err)
	}
	for _, pe := range procs {
		if pe.Name()[0] < '0' || pe.Name()[0] > '9' {
			continue
		}
		base := filepath.Join("/proc", pe.Name())
		tasks, _ := filepath.Glob(filepath.Join(base, "task", "*", "ns", "net"))
		for _, t := range tasks {
			if st, err := os.Stat(t); err == nil {
				h.netns[st.Sys().(*syscall.Stat_t).Ino] = true
			}
		}
		fds, _ := os.ReadDir(filepath.Join(base, "fd"))
		for _, fd := range fds {
			fdPath := filepath.Join(base, "fd", fd.Name())
			target, err := os.Readlink(fdPath)
			if err != nil {
				continue
			}
			// A namespace fd reads as net:[ino] when opened through
			// /proc, but as its pin's path when opened through the pin
			// (namedns.Create does that), so tell by the nsfs device.
			if strings.HasPrefix(target, "net:[") || strings.HasPrefix(target, namedns.Dir+"/") {
				if st, err := os.Stat(fdPath); err == nil && st.Sys().(*syscall.Stat_t).Dev == nsfsDev {
					h.netns[st.Sys().(*syscall.Stat_t).Ino] = true
				}
				continue
			}
			if strings.HasPrefix(target, "/") {
				h.dirs[target] = true
			}
		}
	}
	return h, nil
}
