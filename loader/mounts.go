package loader

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane/bpffs"
	"github.com/kpr-io/kpr/dataplane/leftovers"
)

// DefaultBPFRoot is where kpr pins its maps and links unless told
// otherwise: the directory of every mode's leftovers records.
const DefaultBPFRoot = leftovers.DefaultRoot

// defaultCgroup2Mount is where kpr mounts cgroup2 when the machine has none.
const defaultCgroup2Mount = "/run/kpr/cgroupv2"

type mount struct {
	Point  string
	FSType string
}

func readMounts() ([]mount, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("read /proc/mounts: %w", err)
	}
	defer f.Close()
	var mounts []mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		mounts = append(mounts, mount{Point: unescapeMount(fields[1]), FSType: fields[2]})
	}
	return mounts, sc.Err()
}

// unescapeMount undoes the octal escapes /proc/mounts uses for spaces etc.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// FindCgroup2Mount returns the first cgroup2 mount point from /proc/mounts,
// or "" if cgroup2 is not mounted.
func FindCgroup2Mount() (string, error) {
	mounts, err := readMounts()
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			return m.Point, nil
		}
	}
	return "", nil
}

// cgroup2Mounts returns every cgroup2 mount point, in /proc/mounts' order.
func cgroup2Mounts() ([]string, error) {
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	var points []string
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			points = append(points, m.Point)
		}
	}
	return points, nil
}

// ownCgroup is the directory of the calling process's own cgroup v2 cgroup,
// found through a cgroup2 mount of the root of its cgroup namespace (in a
// container, the container's /sys/fs/cgroup, which may be read-only).
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	path := ""
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			path = rest
		}
	}
	if path == "" {
		return "", errors.New("the process is in no cgroup v2 cgroup (/proc/self/cgroup has no 0:: line)")
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	// mountinfo: ID PARENT MAJ:MIN ROOT POINT OPTIONS... - FSTYPE SOURCE SUPER
	for _, line := range strings.Split(string(info), "\n") {
		before, after, ok := strings.Cut(line, " - ")
		fields, fsFields := strings.Fields(before), strings.Fields(after)
		if !ok || len(fields) < 5 || len(fsFields) == 0 || fsFields[0] != "cgroup2" || fields[3] != "/" {
			continue
		}
		dir := filepath.Join(unescapeMount(fields[4]), path)
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no cgroup2 mount shows the process's own cgroup %s", path)
}

// EnsureCgroup2 returns a cgroup2 mount point, mounting cgroup2 at
// /run/kpr/cgroupv2 when the machine has none.
func EnsureCgroup2() (string, error) {
	point, err := FindCgroup2Mount()
	if err != nil || point != "" {
		return point, err
	}
	if err := os.MkdirAll(defaultCgroup2Mount, 0o755); err != nil {
		return "", fmt.Errorf("create cgroup2 mount point: %w", err)
	}
	if err := unix.Mount("none", defaultCgroup2Mount, "cgroup2", 0, ""); err != nil {
		return "", fmt.Errorf("mount cgroup2 at %s (kpr needs cgroup v2 for its socket hooks): %w", defaultCgroup2Mount, err)
	}
	return defaultCgroup2Mount, nil
}

// EnsureBPFFS makes sure dir lies on a bpffs, mounting one on its parent
// (normally /sys/fs/bpf) if needed, creates dir and its links/ subdirectory
// (mode 0700), and refuses to go on when either could have been written by
// someone other than root (see checkPinDir).
func EnsureBPFFS(dir string) error {
	if err := bpffs.Ensure(dir); err != nil {
		return err
	}
	for _, d := range []string{dir, linkDir(dir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create pin directory %s: %w", d, err)
		}
		// Checked after MkdirAll, whether it created d or found it:
		// someone may have made d first.
		if err := checkPinDir(d); err != nil {
			return err
		}
	}
	return nil
}

// checkPinDir refuses a pin directory that a user other than root (or kpr's
// own user) owns or may write to, and one holding entries such a user owns.
// kpr adopts the maps and links pinned there, so whoever can write the
// directory can delete or replace them: delete the pinned links and Service
// translation stops when kpr exits; replace a map and they steer it. A bpffs
// mounted world-writable lets any user pre-create the directory.
func checkPinDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("check pin directory %s: %w", dir, err)
	}
	fix := fmt.Sprintf("if its contents are kpr's own, run `chown -R root:root %s && chmod go-w %s`; "+
		"otherwise remove it (`rm -r %s`) and kpr creates a fresh one", dir, dir, dir)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("refusing BPF pin directory %s: it is not a directory (mode %#o); remove it (`rm %s`) and kpr creates one", dir, st.Mode, dir)
	}
	if !trustedUID(st.Uid) {
		return fmt.Errorf("refusing to adopt BPF pin directory %s: it is owned by uid %d, not root, so that user can delete or replace kpr's pinned maps and links; %s",
			dir, st.Uid, fix)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("refusing to adopt BPF pin directory %s: its mode %04o lets group or others write it, so they can delete or replace kpr's pinned maps and links; %s",
			dir, st.Mode&0o7777, fix)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("check pin directory %s: %w", dir, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		var est unix.Stat_t
		if err := unix.Lstat(p, &est); err != nil {
			return fmt.Errorf("check pin %s: %w", p, err)
		}
		if !trustedUID(est.Uid) {
			return fmt.Errorf("refusing to adopt BPF pin directory %s: it holds %s, owned by uid %d, not root, which kpr would adopt as its own; %s",
				dir, p, est.Uid, fix)
		}
	}
	return nil
}

// trustedUID reports whether a pin owned by uid is root's or kpr's own.
func trustedUID(uid uint32) bool { return uid == 0 || uid == uint32(os.Geteuid()) }
