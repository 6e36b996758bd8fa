// Package cgroupprocs lists the processes of a cgroup v2 subtree, for the
// parts of kpr that reach a process's network namespace through the
// cgroups it sits in (UDP socket termination, the per-pod socket LB).
package cgroupprocs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PIDs lists the processes in root and every cgroup below it. A cgroup
// removed while walking is skipped; PIDs outside this PID namespace (read
// as 0) are left out.
func PIDs(root string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != root {
				return nil // a cgroup removed while walking
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil // removed meanwhile, or not a cgroup
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if err != nil {
		return pids, fmt.Errorf("list processes of cgroup %s: %w", root, err)
	}
	return pids, nil
}
