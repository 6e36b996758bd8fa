package main

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
)

// The operators' commands read kpr's state from the kernel: pinned maps
// and links under --bpf-root, tc filters, netfilter tables, throw-away
// probe programs. Run without the privilege to, every read fails with
// EPERM or EACCES, which would otherwise show as "0 of 22 features", "no
// dataplane of kpr's" or an empty table: an answer about the process
// dressed as one about the node. These errors say so instead, and end kpr
// with exitNeedsRoot.

// hasPrivilege reports whether this process may read and change kpr's
// kernel state: CAP_SYS_ADMIN or CAP_BPF in its effective set, which root
// has unless a container dropped them.
func hasPrivilege() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	return has(unix.CAP_SYS_ADMIN) || has(unix.CAP_BPF)
}

// needsRoot is the error of `kpr command` that could not do what (such as
// "read the pinned maps under /sys/fs/bpf/kpr") for want of privilege;
// cause is what the kernel answered.
func needsRoot(command, what string, cause error) error {
	return withExitCode(exitNeedsRoot, fmt.Errorf("kpr %s needs root (or CAP_BPF) to %s; run it with sudo (%w)", command, what, cause))
}

// asNeedsRoot is err as needsRoot's error where the kernel refused it
// (EPERM, EACCES) to a process without privilege; otherwise err as it
// is. A privileged process that is refused meets a policy (an LSM,
// seccomp, a read-only mount), which running as root would not change.
func asNeedsRoot(err error, privileged bool, command, what string) error {
	if err == nil || privileged || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return needsRoot(command, what, err)
}

// isNeedsRoot reports whether err is needsRoot's.
func isNeedsRoot(err error) bool {
	var coded *exitError
	return errors.As(err, &coded) && coded.code == exitNeedsRoot
}
