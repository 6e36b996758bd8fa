package loader

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultBPFRoot is where kpr pins its maps and links unless told otherwise.
const DefaultBPFRoot = "/sys/fs/bpf/kpr"

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
// (normally /sys/fs/bpf) if needed, and creates dir.
func EnsureBPFFS(dir string) error {
	onBPFFS, err := isBPFFS(dir)
	if err != nil {
		return err
	}
	if !onBPFFS {
		parent := filepath.Dir(dir)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", parent, err)
		}
		if err := unix.Mount("bpf", parent, "bpf", 0, ""); err != nil {
			return fmt.Errorf("mount bpffs at %s (pinning needs it): %w", parent, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", dir, err)
	}
	return nil
}

// isBPFFS reports whether path, or its nearest existing ancestor, is on bpffs.
func isBPFFS(path string) (bool, error) {
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if errors.Is(err, unix.ENOENT) && p != "/" {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("statfs %s: %w", p, err)
		}
		return st.Type == unix.BPF_FS_MAGIC, nil
	}
}
