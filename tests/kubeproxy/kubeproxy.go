// Package kubeproxy runs real upstream kube-proxy (built by the test tools
// module, tests/tools) inside a test's node network namespace, for the
// benchmarks and for the migration and cleanup tests that need the state
// kube-proxy really writes.
package kubeproxy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
)

// Options are what one kube-proxy run is started with.
type Options struct {
	// ToolsDir holds the kube-proxy binary.
	ToolsDir string
	// Mode is kube-proxy's --proxy-mode: "iptables" or "nftables".
	Mode string
	// NodeName is the Node object kube-proxy reads as its own.
	NodeName string
	// Kubeconfig reaches the API server from inside the node namespace.
	Kubeconfig string
	// MinSyncPeriod is kube-proxy's minSyncPeriod; 0 is the closest it can
	// express to "none" (see MinSync).
	MinSyncPeriod time.Duration
	// LogDir receives the configuration and the log.
	LogDir string
	// Cgroup, if set, is an empty cgroup of kube-proxy's own, for it and
	// the iptables/nft children it runs (their CPU time).
	Cgroup *harness.Cgroup
}

// Process is kube-proxy serving a node namespace.
type Process struct {
	cmd     *exec.Cmd
	cgroup  string
	logPath string
	done    chan struct{}
	err     error
}

// config is the KubeProxyConfiguration of a run. All conntrack settings
// are zero so kube-proxy writes none of the conntrack sysctls: the global
// ones (nf_conntrack_max, the hash size) belong to the host, and a test
// must not change them.
const config = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clientConnection:
  kubeconfig: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  minSyncPeriod: %s
nftables:
  minSyncPeriod: %s
`

// Start starts kube-proxy in ns.
func Start(ns *harness.NetNS, o Options) (*Process, error) {
	bin := filepath.Join(o.ToolsDir, "kube-proxy")
	cfgPath := filepath.Join(o.LogDir, "kube-proxy-"+o.Mode+".yaml")
	period := MinSync(o.MinSyncPeriod)
	cfg := fmt.Sprintf(config, o.Mode, o.NodeName, o.Kubeconfig, period, period)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	kp := &Process{logPath: filepath.Join(o.LogDir, "kube-proxy-"+o.Mode+".log"), done: make(chan struct{})}
	logFile, err := os.Create(kp.logPath)
	if err != nil {
		return nil, err
	}
	// -v=2 logs every sync with its duration: the log explains a slow run.
	kp.cmd = exec.Command(bin, "--config", cfgPath, "-v=2")
	kp.cmd.Stdout, kp.cmd.Stderr = logFile, logFile
	// Its own process group, so Stop also reaches an iptables-restore or
	// nft it is running; born into its own cgroup, if given, so that
	// cgroup's CPU time is kube-proxy's plus its children's.
	kp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if o.Cgroup != nil {
		kp.cgroup = o.Cgroup.Path
		kp.cmd.SysProcAttr.UseCgroupFD = true
		kp.cmd.SysProcAttr.CgroupFD = o.Cgroup.FD()
	}
	// Forked from a thread inside the node namespace: kube-proxy and every
	// iptables/nft it runs see only the node's tables.
	if err := harness.StartCommand(ns, kp.cmd); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() {
		kp.err = kp.cmd.Wait()
		logFile.Close()
		close(kp.done)
	}()
	return kp, nil
}

// MinSync is the min sync period kube-proxy is given for want: its
// configuration reads 0 as "default" (1s), so 0 becomes 1ms, the closest
// it can express.
func MinSync(want time.Duration) time.Duration {
	return max(want, time.Millisecond)
}

// PID is the kube-proxy process's.
func (k *Process) PID() int { return k.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (k *Process) Exited() (bool, error) {
	select {
	case <-k.done:
		return true, k.err
	default:
		return false, nil
	}
}

// Stop ends kube-proxy, SIGTERM and then SIGKILL after 10s, as the kubelet
// does. It leaves kube-proxy's rules in place (kube-proxy does not remove
// them on exit). Idempotent.
func (k *Process) Stop() error {
	select {
	case <-k.done:
		return nil
	default:
	}
	pgid := k.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		// Not reaped yet, so the group id is still ours.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-k.done
	}
	return nil
}

// Log is kube-proxy's log so far.
func (k *Process) Log() string {
	b, _ := os.ReadFile(k.logPath)
	return string(b)
}

// LogTail is the end of its log, for failure messages.
func (k *Process) LogTail() string { return Tail(k.Log(), 30) }

// CgroupPath is kube-proxy's own cgroup, or "" if it was given none.
func (k *Process) CgroupPath() string { return k.cgroup }

// Tail is the last lines of s.
func Tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// ToolsDir returns where hack/tools.sh put kube-proxy, building it if
// needed (as tests/cluster does for the API server); the script answers at
// once when the tools are built.
func ToolsDir() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "hack", "tools.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools.sh (builds kube-proxy, kube-apiserver and etcd): %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if _, err := os.Stat(filepath.Join(dir, "kube-proxy")); err != nil {
		return "", fmt.Errorf("no kube-proxy in %s: %w", dir, err)
	}
	return dir, nil
}
