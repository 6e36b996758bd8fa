package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupPrefix starts the directory name of every test cgroup.
const cgroupPrefix = NamePrefix + "test-"

// Cgroup is a fresh cgroup v2 directory made for one test, so BPF cgroup
// programs can be attached to it without touching any other process.
type Cgroup struct {
	// Path is the cgroup directory, <cgroup2 mount>/kpr-test-<random>.
	Path string

	dir *os.File
	// home is the cgroup (absolute directory) the test process was in when
	// the Cgroup was created; the process and any PID still inside are moved
	// back there at cleanup so the directory can be removed.
	home string

	mu      sync.Mutex
	removed bool
}

// NewCgroup creates a cgroup under the cgroup2 mount and registers its
// removal with tb.Cleanup (which first moves every process still inside it,
// including the test process after EnterProcess, back to where the test
// process came from).
func NewCgroup(tb testing.TB) (*Cgroup, error) {
	tb.Helper()
	sweepStaleOnce()
	mount, err := Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	rel, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	cg := &Cgroup{
		Path: filepath.Join(mount, cgroupPrefix+randomSuffix(8)),
		home: filepath.Join(mount, rel),
	}
	if err := os.Mkdir(cg.Path, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", cg.Path, err)
	}
	if cg.dir, err = os.Open(cg.Path); err != nil {
		return nil, errors.Join(fmt.Errorf("open cgroup %s: %w", cg.Path, err), cg.remove())
	}
	tb.Cleanup(func() {
		if err := cg.remove(); err != nil {
			tb.Errorf("harness: removing cgroup: %v", err)
		}
	})
	return cg, nil
}

// FD returns an open O_RDONLY descriptor of the cgroup directory, as needed
// by BPF_PROG_ATTACH. It is closed at cleanup; do not close it.
func (c *Cgroup) FD() int { return int(c.dir.Fd()) }

// EnterProcess moves the whole test process (all its threads) into the
// cgroup, so sockets it creates afterwards, in any netns, are subject to
// programs attached to the cgroup. Cleanup moves it back. This affects every
// test running in parallel in the same binary.
func (c *Cgroup) EnterProcess() error { return c.AddPID(os.Getpid()) }

// AddPID moves process pid into the cgroup.
func (c *Cgroup) AddPID(pid int) error {
	return movePID(c.Path, pid)
}

// PIDs lists the processes currently in the cgroup.
func (c *Cgroup) PIDs() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("read %s/cgroup.procs: %w", c.Path, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse pid %q in %s/cgroup.procs: %w", f, c.Path, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// remove evacuates the cgroup and deletes it. Idempotent.
func (c *Cgroup) remove() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	c.removed = true
	if c.dir != nil {
		_ = c.dir.Close()
	}
	var errs []error
	pids, err := c.PIDs()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, pid := range pids {
		// A process may exit between listing and moving: ESRCH is fine.
		if err := movePID(c.home, pid); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("move pid %d out of %s: %w", pid, c.Path, err))
		}
	}
	// Exited tasks can keep the cgroup busy for a moment after they leave.
	var rmErr error
	for range 50 {
		rmErr = unix.Rmdir(c.Path)
		if rmErr == nil || errors.Is(rmErr, unix.ENOENT) {
			rmErr = nil
			break
		}
		if !errors.Is(rmErr, unix.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rmErr != nil {
		errs = append(errs, fmt.Errorf("rmdir cgroup %s (remove by hand with rmdir once it is empty): %w", c.Path, rmErr))
	}
	return errors.Join(errs...)
}

func movePID(cgroupDir string, pid int) error {
	procs := filepath.Join(cgroupDir, "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("move pid %d into cgroup %s: %w", pid, cgroupDir, err)
	}
	return nil
}

// Cgroup2Mount returns the mount point of the cgroup v2 hierarchy, read
// from /proc/mounts (it is /sys/fs/cgroup on pure v2 systems and often
// /sys/fs/cgroup/unified on hybrid ones).
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read /proc/mounts: %w", err)
	}
	return "", errors.New("no cgroup2 filesystem in /proc/mounts; mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`")
}

// ownCgroup returns the test process's cgroup v2 path relative to the mount
// (the "0::" line of /proc/self/cgroup).
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return rel, nil
		}
	}
	return "", errors.New("/proc/self/cgroup has no cgroup v2 (0::) entry")
}
