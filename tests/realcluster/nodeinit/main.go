// Command nodeinit is PID 1 of a node VM of the real test cluster
// (tests/realcluster). It boots from the initramfs, moves the root onto a
// tmpfs (runc's pivot_root cannot leave the initramfs' rootfs), mounts what
// a node has, loads the kernel modules, then carries out the node's
// configuration (package nodeconfig), which the host passed through fw_cfg:
// sysctls, host name, files, the network, and the services, containerd and
// the kubelet among them, which it keeps running for the VM's life.
//
// Its own lines on the console start with Marker; the host waits on them.
// It is built static (CGO_ENABLED=0): the initramfs has no libc.
package main

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/tests/kernels/guest"
	"github.com/kpr-io/kpr/tests/realcluster/nodeconfig"
)

// Marker starts every line of this init on the console.
const Marker = "@@node "

// newRoot is where the first stage copies the initramfs to.
const newRoot = "/newroot"

func main() {
	os.Setenv("PATH", "/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin")
	os.Setenv("HOME", "/root")
	if len(os.Args) < 2 || os.Args[1] != "stage2" {
		if err := moveToTmpfs(); err != nil {
			report("error", "moving the root to a tmpfs: %v", err)
		}
		halt()
	}
	if err := setUp(); err != nil {
		report("error", "%v", err)
		halt()
	}
	select {}
}

// moveToTmpfs copies the initramfs onto a tmpfs and makes that the root,
// running this init again there as stage 2. The kernel's rootfs cannot be
// pivoted away from, which runc does for every container.
func moveToTmpfs() error {
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", newRoot, err)
	}
	err := filepath.WalkDir("/", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == newRoot {
			return filepath.SkipDir
		}
		target := filepath.Join(newRoot, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if path == "/" {
				return nil
			}
			return os.Mkdir(target, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			return copyFile(path, target, info.Mode().Perm())
		default:
			// The kernel's own initramfs has /dev/console: reading a
			// device would block forever, and stage 2 mounts devtmpfs.
			return nil
		}
	})
	if err != nil {
		return err
	}
	// switch_root (busybox) deletes the initramfs' files, freeing their
	// memory, moves the tmpfs onto / and execs the init there, as PID 1.
	return syscall.Exec("/bin/switch_root", []string{"switch_root", newRoot, "/init", "stage2"}, os.Environ())
}

func copyFile(from, to string, perm fs.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func setUp() error {
	mounts := append(guest.NodeMounts,
		guest.Mount{FSType: "devpts", Target: "/dev/pts"},
		guest.Mount{FSType: "tmpfs", Target: "/dev/shm"})
	if err := guest.MountAll(mounts); err != nil {
		return err
	}
	// Mounts propagate as on a systemd host: the kubelet refuses
	// Bidirectional volume mounts (kpr's bpffs) on a private one.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making / shared: %w", err)
	}
	loaded, errs := guest.LoadModules("/kpr/modules.load", "/kpr/modules")
	for _, err := range errs {
		report("warning", "%v", err)
	}
	report("modules", "%s", strings.Join(loaded, ","))
	cfg, err := nodeconfig.Load(nodeconfig.Path)
	if err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("setting the host name: %w", err)
	}
	for name, value := range cfg.Sysctls {
		path := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
		}
	}
	enableControllers()
	for _, dir := range cfg.Dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	for _, f := range cfg.Files {
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.Path, []byte(f.Data), fs.FileMode(f.Mode)); err != nil {
			return fmt.Errorf("writing %s: %w", f.Path, err)
		}
	}
	if err := network(cfg); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	report("network", "%s on %s", cfg.Address, cfg.Interface)
	for _, s := range cfg.Services {
		if err := start(s); err != nil {
			return err
		}
	}
	return nil
}

// enableControllers hands the cgroup controllers to the root's children,
// as systemd does on a cgroup v2 host: the kubelet's kubepods cgroup and
// runc's containers need cpu, memory, pids and the rest delegated.
func enableControllers() {
	data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		report("warning", "cgroup controllers: %v", err)
		return
	}
	for _, c := range strings.Fields(string(data)) {
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+"+c), 0o644); err != nil {
			report("warning", "enable cgroup controller %s: %v", c, err)
		}
	}
}

func network(cfg *nodeconfig.Config) error {
	if err := guest.LoopbackUp(); err != nil {
		return err
	}
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(cfg.Address)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.ParseIP(cfg.Gateway)}); err != nil {
		return fmt.Errorf("default route via %s: %w", cfg.Gateway, err)
	}
	for _, r := range cfg.Routes {
		_, dst, err := net.ParseCIDR(r.Dst)
		if err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP(r.Via)}); err != nil {
			return fmt.Errorf("route %s via %s: %w", r.Dst, r.Via, err)
		}
	}
	return nil
}

// start runs s: a oneshot to completion, a long-running service until its
// ReadyPath exists, then supervised for the VM's life.
func start(s nodeconfig.Service) error {
	began := time.Now()
	if s.Oneshot {
		if err := run(s); err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		report("done", "%s %.1fs", s.Name, time.Since(began).Seconds())
		return nil
	}
	go supervise(s)
	if s.ReadyPath == "" {
		report("started", "%s", s.Name)
		return nil
	}
	for {
		if _, err := os.Stat(s.ReadyPath); err == nil {
			report("ready", "%s %.1fs", s.Name, time.Since(began).Seconds())
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// supervise runs s again whenever it exits, as a systemd unit with
// Restart=always would.
func supervise(s nodeconfig.Service) {
	for {
		err := run(s)
		report("exited", "%s: %v; restarting", s.Name, err)
		time.Sleep(2 * time.Second)
	}
}

// run runs s to its end with its output on the console, each line
// prefixed with the service's name, so the host's console log shows every
// service.
func run(s nodeconfig.Service) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(s.Args[0], s.Args[1:]...)
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	// The child has its own copy; the reader sees EOF when it exits.
	w.Close()
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fmt.Printf("[%s] %s\n", s.Name, sc.Text())
	}
	return cmd.Wait()
}

func report(kind, format string, args ...any) {
	fmt.Printf("%s%s %s\n", Marker, kind, fmt.Sprintf(format, args...))
}

// halt powers the VM off: PID 1 must not exit (the kernel panics).
func halt() {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		report("error", "power off: %v", err)
	}
	select {}
}
