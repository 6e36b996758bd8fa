// Command run is the kernel matrix (`make test-kernels`): it builds the
// privileged test binaries static, fetches Debian's packaged kernels
// (hack/kernels.sh), boots each in qemu with an initramfs holding
// tests/kernels/init, busybox, kpr and the tests (and, for tests/e2e,
// kube-apiserver and etcd, which its tests start inside the VM), and writes
// what came back on the serial console as a per-kernel summary
// (docs/kernel-matrix.md).
//
// The VMs have no network device (-nic none): nothing they do can reach the
// host's interfaces, routes or firewall.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kpr-io/kpr/tests/kernels/initramfs"
)

func main() { os.Exit(run()) }

func run() int {
	kernels := flag.String("kernels", "bullseye,bookworm,trixie", "Debian suites whose kernel to boot, comma separated")
	packages := flag.String("packages", "./tests/socklb", "test packages to run inside each VM, comma separated")
	testRun := flag.String("run", "", "-test.run for the test binaries (empty: all)")
	out := flag.String("out", "", "write the summary as Markdown to this file (empty: stdout only)")
	timeout := flag.Duration("timeout", 40*time.Minute, "limit for one VM, boot to power-off")
	accel := flag.String("accel", "auto", "qemu accelerator: kvm, tcg, or auto (KVM when /dev/kvm opens and boots, else TCG)")
	logDir := flag.String("log-dir", "bin/kernels", "where each VM's console log is kept")
	flag.Parse()

	if err := os.MkdirAll(*logDir, 0o755); err != nil {
		return fail(err)
	}
	work, err := os.MkdirTemp("", "kpr-kernels-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(work)

	start := time.Now()
	payload, err := build(work, strings.Split(*packages, ","))
	if err != nil {
		return fail(err)
	}
	buildTime := time.Since(start)
	fmt.Fprintf(os.Stderr, "kernels: built init, kpr and %d test binaries in %s\n", len(payload.tests), buildTime.Round(time.Second))

	var args []string
	if *testRun != "" {
		args = append(args, "-test.run="+*testRun)
	}
	args = append(args, fmt.Sprintf("-test.timeout=%s", *timeout-2*time.Minute))

	var results []*result
	failed := false
	for _, suite := range strings.Split(*kernels, ",") {
		r := &result{suite: suite, build: buildTime}
		results = append(results, r)
		if err := r.boot(work, payload, args, *accel, *timeout, *logDir); err != nil {
			r.err = err
		}
		fmt.Fprintln(os.Stderr, r.line())
		if !r.ok() {
			failed = true
		}
	}
	doc := markdown(results, strings.Join(os.Args[1:], " "))
	fmt.Print(doc)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(doc), 0o644); err != nil {
			return fail(err)
		}
	}
	if failed {
		return 1
	}
	return 0
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "kernels:", err)
	return 1
}

// payload is what every initramfs carries besides the kernel's modules.
type payload struct {
	init, kpr, busybox string
	tests              []string
	// testdata maps a test binary's suite name to its package's testdata
	// directory, which the suite reads relative to its own directory.
	testdata map[string]string
	// tools are host executables the tests exec (bpftool, ip, iptables),
	// when present, and the iptables extensions those load.
	tools []string
	// kubeTools are kube-apiserver and etcd, packed when a suite of
	// clusterSuites runs: its tests start them inside the VM.
	kubeTools []string
}

// clusterSuites are the suites whose API-server tests run inside the VM
// (tests/cluster.StartForTest starts the servers there when the VM carries
// them). The other suites' API-server tests run on the host (make test)
// and skip in the VM, which then needs neither the tools nor the memory.
var clusterSuites = map[string]bool{"e2e": true}

// vmMemoryMB is the VM's memory: the initramfs lives in it, and with the
// kube tools (~140 MB, unpacked from a copy of the archive) so do etcd,
// the API server and kpr.
func (p *payload) vmMemoryMB() int {
	if len(p.kubeTools) > 0 {
		return 6144
	}
	return 2048
}

// build compiles the init, kpr and the test binaries static into work:
// the initramfs has no libc.
func build(work string, packages []string) (*payload, error) {
	env := append(os.Environ(), "CGO_ENABLED=0")
	gobuild := func(args ...string) error {
		cmd := exec.Command("go", args...)
		cmd.Env = env
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
		return nil
	}
	p := &payload{init: filepath.Join(work, "init"), kpr: filepath.Join(work, "kpr")}
	if err := gobuild("build", "-o", p.init, "./tests/kernels/init"); err != nil {
		return nil, err
	}
	if err := gobuild("build", "-o", p.kpr, "./cmd/kpr"); err != nil {
		return nil, err
	}
	for _, pkg := range packages {
		bin := filepath.Join(work, filepath.Base(pkg)+".test")
		if err := gobuild("test", "-c", "-o", bin, pkg); err != nil {
			return nil, err
		}
		p.tests = append(p.tests, bin)
		if clusterSuites[filepath.Base(pkg)] && p.kubeTools == nil {
			var err error
			if p.kubeTools, err = kubeTools(); err != nil {
				return nil, err
			}
		}
		if dir := filepath.Join(pkg, "testdata"); isDir(dir) {
			if p.testdata == nil {
				p.testdata = map[string]string{}
			}
			p.testdata[filepath.Base(pkg)] = dir
		}
	}
	for _, bb := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if isStatic(bb) {
			p.busybox = bb
			break
		}
	}
	p.tools = hostTools()
	if p.busybox == "" {
		return nil, errors.New("no static busybox (apt-get install busybox-static, or run `make deps`)")
	}
	return p, nil
}

// toolNames are the host commands the kernel-facing tests exec: bpftool
// (the dump tests), ip (`ip netns exec` in the iptables backend's tests),
// the iptables variants the fallback backend drives, nft (the nftables
// mode's, in tests/e2e's move between it and the IPVS mode), conntrack, and
// util-linux's unshare and setpriv (the loader's probe test builds a pod's
// mount table and capabilities with them; busybox's setpriv cannot drop a
// capability from the bounding set).
var toolNames = []string{"bpftool", "ip", "conntrack", "nft", "unshare", "setpriv",
	"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore",
	"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore",
	"ip6tables-legacy", "ip6tables-legacy-save", "ip6tables-legacy-restore"}

// hostTools finds the host's copies of toolNames, leaving out those the
// host lacks (their tests skip, naming the command), and the xtables
// plugins when iptables is among them.
func hostTools() []string {
	var tools []string
	for _, name := range toolNames {
		if path, err := exec.LookPath(name); err == nil {
			tools = append(tools, path)
		}
	}
	return append(tools, initramfs.XtablesPlugins()...)
}

// kubeTools are the kube-apiserver and etcd that tests/cluster runs,
// where hack/tools.sh keeps them ($KPR_TOOLS_DIR or its cache; it builds
// them once if they are missing).
func kubeTools() ([]string, error) {
	cmd := exec.Command("hack/tools.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("hack/tools.sh (the kube-apiserver and etcd the cluster suites start in the VM): %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	var tools []string
	for _, name := range []string{"kube-apiserver", "etcd"} {
		path := filepath.Join(dir, name)
		if !isStatic(path) {
			return nil, fmt.Errorf("%s is missing or not a static executable (the initramfs has no libc); run `make tools`", path)
		}
		tools = append(tools, path)
	}
	return tools, nil
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// isStatic reports whether path is an executable without an ELF interpreter.
func isStatic(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	return len(b) > 4 && string(b[1:4]) == "ELF" && !bytes.Contains(b[:min(len(b), 4096)], []byte("/lib64/ld-linux"))
}

// result is one kernel's run.
type result struct {
	suite, release string
	build, fetch   time.Duration
	total          time.Duration
	accel          string
	probe          *probeReport
	modules        string
	suites         []*suiteResult
	errors         []string
	err            error
	done           bool
}

type probeReport struct {
	Kernel   string `json:"kernel"`
	Features []struct {
		Name      string `json:"name"`
		Supported bool   `json:"supported"`
		Error     string `json:"error"`
	} `json:"features"`
	ModeAuto struct {
		Backend string `json:"backend"`
	} `json:"modeAuto"`
}

type suiteResult struct {
	name           string
	exit           int
	wall           string
	passed, failed []string
	skipped        []skip
	ended          bool
}

type skip struct{ name, reason string }

func (r *result) ok() bool {
	if r.err != nil || !r.done || len(r.suites) == 0 {
		return false
	}
	for _, s := range r.suites {
		if !s.ended || s.exit != 0 || len(s.failed) > 0 {
			return false
		}
	}
	return true
}

func (r *result) line() string {
	if r.err != nil {
		return fmt.Sprintf("kernels: %s: %v", r.suite, r.err)
	}
	var parts []string
	for _, s := range r.suites {
		parts = append(parts, fmt.Sprintf("%s: %d passed, %d failed, %d skipped (exit %d)", s.name, len(s.passed), len(s.failed), len(s.skipped), s.exit))
	}
	return fmt.Sprintf("kernels: %s (%s, %s): %s; fetch %s, boot+run %s", r.suite, r.release, r.accel, strings.Join(parts, "; "),
		r.fetch.Round(time.Second), r.total.Round(time.Second))
}

// boot fetches the suite's kernel, packs the initramfs, runs the VM and
// parses its console.
func (r *result) boot(work string, p *payload, args []string, accel string, timeout time.Duration, logDir string) error {
	start := time.Now()
	fetch := exec.Command("hack/kernels.sh", r.suite)
	fetch.Stderr = os.Stderr
	dirOut, err := fetch.Output()
	if err != nil {
		return fmt.Errorf("hack/kernels.sh %s: %w", r.suite, err)
	}
	r.fetch = time.Since(start)
	kdir := strings.TrimSpace(string(dirOut))
	rel, err := os.ReadFile(filepath.Join(kdir, "version"))
	if err != nil {
		return err
	}
	r.release = strings.TrimSpace(string(rel))

	initrd := filepath.Join(work, "initrd-"+r.suite+".cpio")
	if err := packInitramfs(initrd, kdir, p, args); err != nil {
		return fmt.Errorf("initramfs for %s: %w", r.suite, err)
	}
	defer os.Remove(initrd)

	logPath := filepath.Join(logDir, r.suite+".log")
	accels := []string{accel}
	if accel == "auto" {
		accels = []string{"tcg"}
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil && !kvmFailed {
			f.Close()
			accels = []string{"kvm", "tcg"}
		}
	}
	for i, accel := range accels {
		r.accel = accel
		started := time.Now()
		console, qerr := qemu(filepath.Join(kdir, "vmlinuz"), initrd, accel, p.vmMemoryMB(), timeout, logPath)
		r.total = time.Since(started)
		if i+1 < len(accels) && (errors.Is(qerr, errNoInit) || (qerr != nil && !bytes.Contains(console, []byte("@@kpr ")))) {
			// KVM did not get as far as the init (nested virtualization
			// hanging, qemu refusing the CPU model): emulate instead.
			fmt.Fprintf(os.Stderr, "kernels: %s: KVM failed (%v), retrying with TCG\n", r.suite, qerr)
			kvmFailed = true
			continue
		}
		r.parse(console)
		if qerr != nil && !r.done {
			return fmt.Errorf("qemu (%s): %w; console in %s", accel, qerr, logPath)
		}
		if !r.done {
			return fmt.Errorf("the VM stopped before the init finished (kernel panic?); console in %s", logPath)
		}
		return nil
	}
	return nil
}

// kvmStartLimit is how long a KVM boot may take to reach the init. Nested
// KVM can hang silently before the kernel prints anything (it does on this
// project's development machine); the runner then emulates instead.
const kvmStartLimit = 30 * time.Second

// kvmFailed remembers, for the kernels after the first, that KVM boots
// here never reach the init.
var kvmFailed bool

// errNoInit is a VM that never reached the init.
var errNoInit = errors.New("no output from the init")

// qemu boots kernel with initrd and returns the serial console's output,
// also written to logPath. The VM powers itself off when the init is done.
func qemu(kernel, initrd, accel string, memoryMB int, timeout time.Duration, logPath string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cpu := "max"
	if accel == "kvm" {
		// Nested KVM (a cloud VM) refuses the ARCH_CAPABILITIES MSR that
		// qemu sets for -cpu host; the tests do not need it.
		cpu = "host,-arch-capabilities"
	}
	// no_timer_check: under emulation on a busy host the kernel's IO-APIC
	// timer check can miss its ticks and panic the boot. lsm=bpf makes the
	// BPF LSM the active one, so that a test can withhold a hook from kpr.
	// loglevel=5 lets the stack traces of a soft lockup or an RCU stall
	// (printed at the default level, 4) reach the log: a 5.10 guest once
	// hung on both CPUs in tests/socklb with only their one-line headers to
	// show for it.
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-accel", accel, "-cpu", cpu, "-smp", "2", "-m", strconv.Itoa(memoryMB),
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 quiet loglevel=5 panic=-1 no_timer_check rdinit=/init lsm=bpf",
		"-nic", "none", "-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	buf := &markerBuffer{started: make(chan struct{})}
	cmd.Stdout = io.MultiWriter(buf, logf)
	cmd.Stderr = io.MultiWriter(buf, logf)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if accel == "kvm" {
		select {
		case <-buf.started:
		case err := <-exited:
			return buf.Bytes(), err
		case <-time.After(kvmStartLimit):
			_ = cmd.Process.Kill()
			<-exited
			return buf.Bytes(), fmt.Errorf("%w within %s", errNoInit, kvmStartLimit)
		}
	}
	err = <-exited
	if ctx.Err() != nil {
		err = fmt.Errorf("VM still running after %s: %w", timeout, ctx.Err())
	}
	return buf.Bytes(), err
}

// markerBuffer collects the console and closes started at the init's
// first framed line.
type markerBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	started chan struct{}
	seen    bool
}

func (m *markerBuffer) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.b.Write(p)
	if !m.seen && bytes.Contains(m.b.Bytes(), []byte("@@kpr ")) {
		m.seen = true
		close(m.started)
	}
	return len(p), nil
}

func (m *markerBuffer) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.b.Bytes())
}

var (
	testLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (\S+)`)
	// A test's log line: "    file.go:12: text".
	reasonLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)`)
)

// parse reads the init's framed lines and the tests' -test.v output.
// Only top-level tests are counted; subtests roll up into their parent.
func (r *result) parse(console []byte) {
	var cur *suiteResult
	// A skip's reason is the test's last log line before its "--- SKIP".
	var lastLog string
	sc := bufio.NewScanner(bytes.NewReader(console))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if i := strings.Index(line, "@@kpr "); i >= 0 {
			kind, text, _ := strings.Cut(line[i+len("@@kpr "):], " ")
			switch kind {
			case "kernel":
				r.release = text
			case "modules":
				r.modules = text
			case "probe":
				var p probeReport
				if err := json.Unmarshal([]byte(text), &p); err == nil {
					r.probe = &p
				} else {
					r.errors = append(r.errors, "probe output: "+err.Error())
				}
			case "suite":
				cur = &suiteResult{name: text}
				r.suites = append(r.suites, cur)
			case "end":
				if f := strings.Fields(text); cur != nil && len(f) == 3 {
					cur.exit, _ = strconv.Atoi(f[1])
					cur.wall = f[2]
					cur.ended = true
				}
			case "error":
				r.errors = append(r.errors, text)
			case "done":
				r.done = true
			}
			continue
		}
		if cur == nil {
			continue
		}
		if strings.HasPrefix(line, "=== ") {
			lastLog = ""
			continue
		}
		if m := testLine.FindStringSubmatch(line); m != nil {
			switch m[1] {
			case "PASS":
				cur.passed = append(cur.passed, m[2])
			case "FAIL":
				cur.failed = append(cur.failed, m[2])
			case "SKIP":
				cur.skipped = append(cur.skipped, skip{name: m[2], reason: lastLog})
			}
			lastLog = ""
			continue
		}
		if m := reasonLine.FindStringSubmatch(line); m != nil {
			lastLog = m[1]
		}
	}
}

// markdown is the summary: one column per kernel.
func markdown(results []*result, args string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Kernel matrix\n\n")
	fmt.Fprintf(&b, "Generated by `make test-kernels` (`go run ./tests/kernels/run %s`) on %s.\n", args, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	b.WriteString(`Each column is a Debian kernel (` + "`linux-image-*`" + ` from deb.debian.org, fetched by hack/kernels.sh with a
private apt configuration and cached in ~/.cache/kpr/kernels) booted in qemu with no network device. Its
initramfs holds tests/kernels/init (PID 1: mounts proc, sys, devtmpfs, /run, /tmp, bpffs and cgroup2, brings
lo up, loads the modules below, sets ` + "`ulimit -l unlimited`" + ` as ` + "`kpr probe`" + ` asks of kernels before 5.11),
static busybox, the host's bpftool, ip, iptables (nft and legacy, with their extensions) and conntrack with their libraries,
the kernel booted with lsm=bpf, each suite in its own directory with its package's testdata, a static kpr and the ` + "`go test -c`" + ` binaries.
The feature rows are ` + "`kpr probe -o json`" + ` run inside the VM; the test rows count top-level tests.
` + "`make test-kernel-oldest`" + ` runs the 5.10 column alone. Console logs: bin/kernels/<suite>.log.

`)

	fmt.Fprintf(&b, "| | %s |\n|---|%s\n", join(results, func(r *result) string { return r.suite + " " + r.release }), strings.Repeat("---|", len(results)))
	var features []string
	seen := map[string]bool{}
	for _, r := range results {
		if r.probe == nil {
			continue
		}
		for _, f := range r.probe.Features {
			if !seen[f.Name] {
				seen[f.Name] = true
				features = append(features, f.Name)
			}
		}
	}
	for _, name := range features {
		fmt.Fprintf(&b, "| %s | %s |\n", name, join(results, func(r *result) string {
			if r.probe == nil {
				return "?"
			}
			for _, f := range r.probe.Features {
				if f.Name == name {
					if f.Supported {
						return "yes"
					}
					return "no"
				}
			}
			return "not probed"
		}))
	}
	fmt.Fprintf(&b, "| `--mode auto` picks | %s |\n", join(results, func(r *result) string {
		if r.probe == nil || r.probe.ModeAuto.Backend == "" {
			return "?"
		}
		return r.probe.ModeAuto.Backend
	}))
	var suites []string
	seenSuite := map[string]bool{}
	for _, r := range results {
		for _, s := range r.suites {
			if !seenSuite[s.name] {
				seenSuite[s.name] = true
				suites = append(suites, s.name)
			}
		}
	}
	for _, name := range suites {
		fmt.Fprintf(&b, "| tests/%s passed / failed / skipped | %s |\n", name, join(results, func(r *result) string {
			for _, s := range r.suites {
				if s.name == name {
					v := fmt.Sprintf("%d / %d / %d", len(s.passed), len(s.failed), len(s.skipped))
					if !s.ended {
						v += " (did not finish)"
					}
					return v
				}
			}
			return "not run"
		}))
	}
	fmt.Fprintf(&b, "| accelerator | %s |\n", join(results, func(r *result) string { return r.accel }))
	fmt.Fprintf(&b, "| fetch (download + extract; cached: ~0) | %s |\n", join(results, func(r *result) string { return r.fetch.Round(time.Second).String() }))
	fmt.Fprintf(&b, "| boot + run, power-on to power-off | %s |\n", join(results, func(r *result) string { return r.total.Round(time.Second).String() }))
	if len(results) > 0 {
		fmt.Fprintf(&b, "\nBuilding init, kpr and the test binaries took %s (once for all kernels).\n", results[0].build.Round(time.Second))
	}

	for _, r := range results {
		fmt.Fprintf(&b, "\n## %s (%s)\n\n", r.suite, r.release)
		if r.err != nil {
			fmt.Fprintf(&b, "Run error: %v\n\n", r.err)
		}
		if r.modules != "" {
			fmt.Fprintf(&b, "Modules loaded: %s.\n\n", strings.ReplaceAll(r.modules, ",", ", "))
		}
		for _, e := range r.errors {
			fmt.Fprintf(&b, "- init error: %s\n", e)
		}
		for _, s := range r.suites {
			fmt.Fprintf(&b, "tests/%s: exit %d in %s.\n", s.name, s.exit, s.wall)
			for _, f := range s.failed {
				fmt.Fprintf(&b, "- FAIL %s\n", f)
			}
			sort.Slice(s.skipped, func(i, j int) bool { return s.skipped[i].name < s.skipped[j].name })
			for _, sk := range s.skipped {
				fmt.Fprintf(&b, "- skip %s: %s\n", sk.name, sk.reason)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func join(results []*result, f func(*result) string) string {
	var cells []string
	for _, r := range results {
		cells = append(cells, f(r))
	}
	return strings.Join(cells, " | ")
}
