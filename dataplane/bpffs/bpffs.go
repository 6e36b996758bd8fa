// Package bpffs makes sure a path lies on the BPF filesystem. Every mode
// keeps something there: the eBPF mode its pins, the netfilter modes the
// records of the state they wrote (dataplane/leftovers), which must go at
// a reboot exactly as that state does. A fresh node has nothing mounted
// at /sys/fs/bpf, and whichever mode runs first mounts it.
package bpffs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Ensure makes sure path lies on a bpffs: when its nearest existing
// ancestor is on another filesystem, it mounts a bpffs on path's parent
// (normally /sys/fs/bpf), creating the parent if needed. It creates
// nothing else.
func Ensure(path string) error {
	on, err := On(path)
	if err != nil || on {
		return err
	}
	parent := filepath.Dir(path)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("create %s to mount a bpffs on: %w", parent, err)
	}
	if err := unix.Mount("bpf", parent, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount a bpffs at %s (kpr keeps its pins and records there): %w", parent, err)
	}
	return nil
}

// On reports whether path, or its nearest existing ancestor, is on a
// bpffs.
func On(path string) (bool, error) {
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
