// Package kprproc builds the kpr binary once per test process and runs
// `kpr run` as a real child process, the way a DaemonSet would, for the
// end-to-end tests, the benchmarks and the demo.
package kprproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds ./cmd/kpr into bin/kpr of the repository once per process
// (Go's build cache makes that quick when nothing changed) and returns its
// path. The build goes to a temporary name first and is renamed into place,
// so test processes building at the same time never run a half-written file.
//
// $KPR_BINARY, when set, is a prebuilt kpr used as is: the kernel-matrix
// VMs (tests/kernels) have no Go toolchain to build one.
func Binary() (string, error) {
	buildOnce.Do(func() {
		if bin := os.Getenv("KPR_BINARY"); bin != "" {
			binPath = bin
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		binPath = filepath.Join(root, "bin", "kpr")
		tmp := fmt.Sprintf("%s.build-%d", binPath, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, "./cmd/kpr")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			buildErr = fmt.Errorf("go build ./cmd/kpr: %w\n%s", err, out)
			return
		}
		buildErr = os.Rename(tmp, binPath)
	})
	return binPath, buildErr
}

// Options describe one kpr node daemon.
type Options struct {
	Kubeconfig string
	NodeName   string
	CgroupRoot string
	// BPFRoot defaults to a fresh /sys/fs/bpf/kpr-test-<random>.
	BPFRoot string
	// HostNetNS is the node's network namespace file, passed as
	// --host-netns to `kpr run` and to `kpr cleanup` (the iptables mode
	// programs, and cleanup clears, that namespace's tables); empty means
	// kpr's own.
	HostNetNS string
	// Args are extra `kpr run` flags, e.g. --min-sync-period.
	Args []string
	// LogPath receives kpr's output; default a file under os.TempDir.
	LogPath string
	// Binary is the kpr executable to run; empty means the one Binary
	// builds from this tree. Benchmarks set it to compare two builds
	// against the same API server.
	Binary string
	// CgroupFD, when > 0, is an open cgroup v2 directory that kpr is born
	// into, so that the cgroup's CPU time is kpr's plus that of the
	// iptables-restore children its iptables mode runs (the benchmarks).
	CgroupFD int
}

// binary returns the kpr executable these options run.
func (o Options) binary() (string, error) {
	if o.Binary != "" {
		return o.Binary, nil
	}
	return Binary()
}

// Process is a running (or stopped) `kpr run`.
type Process struct {
	Options
	HealthzAddr string
	MetricsAddr string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// ownLog is set when Start chose LogPath, so Cleanup removes it.
	ownLog bool
}

// Start runs `kpr run`. Stop it with Stop or Kill; Cleanup removes the
// pinned dataplane afterwards.
func Start(opts Options) (*Process, error) {
	bin, err := opts.binary()
	if err != nil {
		return nil, err
	}
	if opts.BPFRoot == "" {
		opts.BPFRoot = "/sys/fs/bpf/kpr-test-" + randomHex(6)
	}
	ownLog := opts.LogPath == ""
	if ownLog {
		f, err := os.CreateTemp("", "kpr-run-*.log")
		if err != nil {
			return nil, err
		}
		f.Close()
		opts.LogPath = f.Name()
	}
	p := &Process{Options: opts, ownLog: ownLog}
	if p.HealthzAddr, err = freeLoopbackAddr(); err != nil {
		return nil, err
	}
	if p.MetricsAddr, err = freeLoopbackAddr(); err != nil {
		return nil, err
	}
	return p, p.start(bin)
}

func (p *Process) start(bin string) error {
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{"run", "--log-format", "console",
		"--kubeconfig", p.Kubeconfig, "--hostname-override", p.NodeName,
		"--cgroup-root", p.CgroupRoot, "--bpf-root", p.BPFRoot,
		"--healthz-bind-address", p.HealthzAddr, "--metrics-bind-address", p.MetricsAddr}
	if p.HostNetNS != "" {
		args = append(args, "--host-netns", p.HostNetNS)
	} else {
		// kpr writes kube-proxy's conntrack sysctls into the node's
		// namespace, which is then its own: for a test run in the
		// machine's namespace, the machine's. A test gets them only
		// in a namespace of its own.
		args = append(args, "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0")
	}
	if !wantsTC(p.Args) {
		// Without --devices kpr attaches its tc programs to every device
		// of its namespace that carries an address: for a test run in
		// the machine's own namespace, its real NICs. A test gets them
		// only by asking.
		args = append(args, "--tc-attach=none")
	}
	p.cmd = exec.Command(bin, append(args, p.Args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// A test binary killed outright must not leave kpr running.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.CgroupFD > 0 {
		p.cmd.SysProcAttr.UseCgroupFD = true
		p.cmd.SysProcAttr.CgroupFD = p.CgroupFD
	}
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start kpr run: %w", err)
	}
	p.done = make(chan struct{})
	go func() {
		p.err = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return nil
}

// wantsTC says whether args ask for the tc programs (--devices or
// --tc-attach).
func wantsTC(args []string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, "--devices") || strings.HasPrefix(a, "--tc-attach") {
			return true
		}
	}
	return false
}

// PID is the running process's id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Restart starts a new `kpr run` with the same options after a Stop or Kill.
func (p *Process) Restart() error {
	bin, err := p.binary()
	if err != nil {
		return err
	}
	return p.start(bin)
}

// Stop sends SIGTERM and waits for the exit: kpr leaves the dataplane.
func (p *Process) Stop() error { return p.signal(syscall.SIGTERM) }

// Kill sends SIGKILL, as a crash or an OOM kill would.
func (p *Process) Kill() error { return p.signal(syscall.SIGKILL) }

func (p *Process) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		if sig == syscall.SIGKILL {
			return nil
		}
		return p.err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("kpr did not exit within 10s of %s", sig)
	}
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitError is how the process ended (nil while it runs, or for a clean
// exit), for a test's failure report.
func (p *Process) ExitError() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Cleanup stops kpr if needed and removes its pinned dataplane.
func (p *Process) Cleanup() error {
	_ = p.Kill()
	bin, err := p.binary()
	if err != nil {
		return err
	}
	args := []string{"cleanup", "--bpf-root", p.BPFRoot, "--cgroup-root", p.CgroupRoot}
	if p.HostNetNS != "" {
		args = append(args, "--host-netns", p.HostNetNS)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if p.ownLog {
		os.Remove(p.LogPath)
	}
	if err != nil {
		return fmt.Errorf("kpr cleanup: %w: %s", err, out)
	}
	return nil
}

// Log returns what kpr has printed so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// WaitSynced waits until kpr has finished its first full sync: then the
// maps hold every Service the API had. /healthz alone is not enough, since
// like kube-proxy's it answers 200 before the first sync.
func (p *Process) WaitSynced(ctx context.Context) error {
	for {
		if p.Exited() {
			return fmt.Errorf("kpr exited before its first sync: %v\n%s", p.err, tail(p.Log(), 30))
		}
		if synced, err := p.LastSync(); err == nil && synced > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kpr did not finish its first sync: %w\n%s", ctx.Err(), tail(p.Log(), 30))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LastSync returns kubeproxy_sync_proxy_rules_last_timestamp_seconds (of
// IPv4; kpr syncs both families at once):
// zero until the first successful sync.
func (p *Process) LastSync() (float64, error) {
	v, err := p.Metric(`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`)
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(v, 64)
}

// Metric returns the value of one series of /metrics, named as the scrape
// spells it, labels included (e.g. `kpr_bpf_map_entries{map="kpr_services"}`).
func (p *Process) Metric(series string) (string, error) {
	text, err := p.Metrics()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("metric %s not found", series)
}

// MetricIs reports whether series has the value want: nil if so, else an
// error saying what it has.
func (p *Process) MetricIs(series, want string) error {
	v, err := p.Metric(series)
	if err != nil {
		return err
	}
	if v != want {
		return fmt.Errorf("%s = %s, want %s", series, v, want)
	}
	return nil
}

// Probe answers one GET of a health endpoint (/healthz, /livez) with its
// status code.
func (p *Process) Probe(path string) (int, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.HealthzAddr + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// DumpService is one entry of `kpr dump -o json`.
type DumpService struct {
	Frontend        string   `json:"frontend"`
	Protocol        string   `json:"protocol"`
	Scope           string   `json:"scope"`
	Kind            string   `json:"kind"`
	AffinityTimeout uint32   `json:"affinityTimeoutSeconds"`
	Backends        []string `json:"backends"`
}

// Dump runs `kpr dump -o json` against this process's maps.
func (p *Process) Dump() ([]DumpService, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(bin, "dump", "-o", "json", "--bpf-root", p.BPFRoot).Output()
	if err != nil {
		return nil, fmt.Errorf("kpr dump: %w", err)
	}
	var svcs []DumpService
	if err := json.Unmarshal(out, &svcs); err != nil {
		return nil, fmt.Errorf("parse kpr dump: %w", err)
	}
	return svcs, nil
}

// Metrics returns the text of /metrics.
func (p *Process) Metrics() (string, error) {
	resp, err := http.Get("http://" + p.MetricsAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}
