// Package guest is what every init of the project's qemu VMs does before
// its own work: the pseudo-filesystems a node has, the loopback, and the
// kernel modules hack/kernels.sh extracted. The kernel-matrix init
// (tests/kernels/init) and the real cluster's node init
// (tests/realcluster/nodeinit) use it; both are static binaries in an
// initramfs with no other tools to lean on.
package guest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Mount is one filesystem to mount.
type Mount struct{ FSType, Target string }

// NodeMounts are what a node has and kpr and its tests use: /run for
// named namespaces and runtime state, cgroup2 for cgroups, bpffs for pins.
var NodeMounts = []Mount{
	{"proc", "/proc"},
	{"sysfs", "/sys"},
	{"devtmpfs", "/dev"},
	{"tmpfs", "/run"},
	{"tmpfs", "/tmp"},
	{"bpf", "/sys/fs/bpf"},
	{"cgroup2", "/sys/fs/cgroup"},
	{"tracefs", "/sys/kernel/tracing"},
	// securityfs lists the active LSMs, which the withheld-hook test checks.
	{"securityfs", "/sys/kernel/security"},
}

// MountAll mounts each of mounts, making its target first; one already
// mounted is fine.
func MountAll(mounts []Mount) error {
	for _, m := range mounts {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.FSType, m.Target, m.FSType, 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s on %s: %w", m.FSType, m.Target, err)
		}
	}
	return nil
}

// LoopbackUp sets lo up; a new kernel starts with it down.
func LoopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

// LoadModules loads the modules named in list (one a line, dependencies
// first, as hack/kernels.sh wrote them) from dir, and returns the names it
// loaded and an error for each it could not. A module the kernel has built
// in is not in the list; one already loaded is fine.
func LoadModules(list, dir string) (loaded []string, errs []error) {
	f, err := os.Open(list)
	if err != nil {
		return nil, []error{fmt.Errorf("modules: %w", err)}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		if err := loadModule(filepath.Join(dir, name+".ko")); err != nil {
			errs = append(errs, fmt.Errorf("load module %s: %w", name, err))
			continue
		}
		loaded = append(loaded, name)
	}
	return loaded, errs
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && err != unix.EEXIST {
		return err
	}
	return nil
}

// KernelRelease is `uname -r`.
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
