// Command init is PID 1 of the kernel-matrix VMs (see tests/kernels/run):
// it prepares the mounts and modules the privileged tests expect of a node,
// runs `kpr probe -o json` and each test binary it finds in /kpr/tests, and
// powers the VM off. Everything it reports goes to the serial console,
// framed by lines starting with Marker, which the host runner parses.
//
// It is built static (CGO_ENABLED=0) because the initramfs has no libc.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/tests/kernels/guest"
)

// Marker starts every line the host runner parses; nothing else on the
// console (kernel messages, test output) starts with it.
const Marker = "@@kpr "

func main() {
	os.Setenv("PATH", "/bin:/sbin:/usr/bin:/usr/sbin:/kpr")
	os.Setenv("HOME", "/root")
	os.Setenv("TMPDIR", "/tmp")
	// tests/kprproc runs this kpr instead of building one.
	os.Setenv("KPR_BINARY", "/kpr/kpr")
	// tests/cluster starts the kube-apiserver and etcd the runner packed
	// for the cluster suites (tests/e2e), on the VM's loopback.
	if _, err := os.Stat("/kpr/kube"); err == nil {
		os.Setenv("KPR_TOOLS_DIR", "/kpr/kube")
	}
	// Tests that change the whole kernel (e.g. withholding a hook through
	// the BPF LSM) run only where this is set: inside these VMs.
	os.Setenv("KPR_KERNEL_MATRIX", guest.KernelRelease())
	if err := guest.MountAll(guest.NodeMounts); err != nil {
		report("error", "mounts: %v", err)
	}
	// Before 5.11 BPF maps are charged to RLIMIT_MEMLOCK, whose default
	// (64 KiB) fits none of kpr's; `kpr probe` tells operators to run kpr
	// with `ulimit -l unlimited`, and so does this init for the tests.
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}); err != nil {
		report("error", "raise RLIMIT_MEMLOCK: %v", err)
	}
	if err := guest.LoopbackUp(); err != nil {
		report("error", "loopback: %v", err)
	}
	loadModules("/kpr/modules.load", "/kpr/modules")
	report("kernel", "%s", guest.KernelRelease())
	probe()
	runTests("/kpr/tests", readArgs("/kpr/test-args"))
	report("done", "")
	unix.Sync()
	// PID 1 must not exit (the kernel panics); power off instead.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		report("error", "power off: %v", err)
	}
	select {}
}

// report prints one framed line: "@@kpr <kind> <text>".
func report(kind, format string, args ...any) {
	fmt.Printf("%s%s %s\n", Marker, kind, fmt.Sprintf(format, args...))
}

// loadModules loads hack/kernels.sh's modules and reports what it loaded.
func loadModules(list, dir string) {
	loaded, errs := guest.LoadModules(list, dir)
	for _, err := range errs {
		report("error", "%v", err)
	}
	report("modules", "%s", strings.Join(loaded, ","))
}

// probe prints kpr's own feature report, the matrix's feature columns.
func probe() {
	out, err := exec.Command("/kpr/kpr", "probe", "-o", "json").Output()
	if err != nil {
		report("error", "kpr probe: %v", err)
		return
	}
	report("probe", "%s", strings.Join(strings.Fields(string(out)), " "))
}

// readArgs reads the test binaries' flags, one a line.
func readArgs(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var args []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			args = append(args, l)
		}
	}
	return args
}

// runTests runs every <suite>.test binary in dir with -test.v, its output
// straight to the console, framed by suite and end markers with the exit
// status and wall time.
func runTests(dir string, args []string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		report("error", "tests: %v", err)
		return
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".test") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, name := range names {
		suite := strings.TrimSuffix(name, ".test")
		report("suite", "%s", suite)
		cmd := exec.Command(filepath.Join(dir, name), append([]string{"-test.v", "-test.count=1"}, args...)...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		// Each suite runs from its own directory, as `go test` runs it
		// from its package's: the runner packs the testdata there.
		cmd.Dir = filepath.Join("/kpr/src", suite)
		if err := os.MkdirAll(cmd.Dir, 0o755); err != nil {
			report("error", "suite directory %s: %v", cmd.Dir, err)
		}
		start := time.Now()
		err := cmd.Run()
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else {
				report("error", "run %s: %v", name, err)
			}
		}
		report("end", "%s %d %.1fs", suite, code, time.Since(start).Seconds())
	}
}
