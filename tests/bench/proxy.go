package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// Proxy names, as they appear in results and plots.
const (
	ProxyKPR      = "kpr"
	ProxyIPTables = "kube-proxy-iptables"
	ProxyNFTables = "kube-proxy-nftables"
)

// AllProxies is every proxy the harness can run, in run order. kpr's own
// iptables fallback is not built yet, so it is not here.
var AllProxies = []string{ProxyKPR, ProxyIPTables, ProxyNFTables}

// proxySettings are what every proxy run is started with.
type proxySettings struct {
	// ToolsDir holds the kube-proxy binary.
	ToolsDir string
	// Kubeconfig reaches the API server from inside the node namespace.
	Kubeconfig string
	// CgroupRoot is the test-owned cgroup holding the client (the test
	// process); kpr attaches to it.
	CgroupRoot string
	// MinSyncPeriod is given to every proxy alike (kube-proxy's default
	// is 1s, kpr's 0).
	MinSyncPeriod time.Duration
	// Services is the number of Services, to size kpr's maps.
	Services int
	// LogDir receives the proxy's log.
	LogDir string
	// Cgroup is an empty cgroup of the proxy's own, for kube-proxy and
	// the iptables/nft children it runs (their CPU time).
	Cgroup *harness.Cgroup
}

// runningProxy is one proxy process serving a node namespace.
type runningProxy interface {
	PID() int
	// Exited reports whether the process has ended, and how.
	Exited() (bool, error)
	// Stop ends the process and removes whatever it left outside its
	// node namespace (kpr's pins and cgroup links). Idempotent.
	Stop() error
	// LogTail is the end of its log, for failure messages.
	LogTail() string
	// BPFMapBytes is the memory of its BPF maps, or nil when it has none.
	BPFMapBytes() (*int64, error)
	// CgroupPath is a cgroup holding the proxy and its children only, or
	// "" when it runs in the client's cgroup (kpr, which runs no children).
	CgroupPath() string
}

// startProxy starts the named proxy inside env's node namespace.
func startProxy(name string, env *NodeEnv, s proxySettings) (runningProxy, error) {
	switch name {
	case ProxyKPR:
		return startKPR(env, s)
	case ProxyIPTables:
		return startKubeProxy("iptables", env, s)
	case ProxyNFTables:
		return startKubeProxy("nftables", env, s)
	}
	return nil, fmt.Errorf("unknown proxy %q (known: %s)", name, strings.Join(AllProxies, ", "))
}

// kprRun is `kpr run` in the node namespace, attached to the client cgroup,
// pinned under a fresh /sys/fs/bpf/kpr-bench-<random>.
type kprRun struct {
	p       *kprproc.Process
	stopped bool
}

func startKPR(env *NodeEnv, s proxySettings) (*kprRun, error) {
	// Build outside the node namespace, which has no route to anywhere a
	// build could need.
	if _, err := kprproc.Binary(); err != nil {
		return nil, err
	}
	args := []string{"--min-sync-period", s.MinSyncPeriod.String()}
	// Every Service takes a master entry plus one slot per endpoint.
	if need := uint32(s.Services*(backendsPerGroup+1) + 1024); need > 262144 {
		args = append(args, "--map-size-services", fmt.Sprint(need), "--map-size-revnat", fmt.Sprint(s.Services+1024))
	}
	opts := kprproc.Options{
		Kubeconfig: s.Kubeconfig,
		NodeName:   nodeName,
		CgroupRoot: s.CgroupRoot,
		BPFRoot:    "/sys/fs/bpf/kpr-bench-" + randomHex(6),
		Args:       args,
		LogPath:    filepath.Join(s.LogDir, "kpr.log"),
	}
	var p *kprproc.Process
	// The child is forked from a thread inside the node namespace and
	// stays there; its health and metrics ports are the node's.
	err := harness.Do(env.Node.NetNS, func() error {
		var err error
		p, err = kprproc.Start(opts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start kpr in %s: %w", env.Node.NetNS.Name, err)
	}
	return &kprRun{p: p}, nil
}

func (k *kprRun) PID() int { return k.p.PID() }

func (k *kprRun) Exited() (bool, error) { return k.p.Exited(), nil }

func (k *kprRun) Stop() error {
	if k.stopped {
		return nil
	}
	k.stopped = true
	stopErr := k.p.Stop()
	// Cleanup detaches the programs from the client cgroup and removes
	// the pins, so the next proxy run starts from nothing.
	if err := k.p.Cleanup(); err != nil {
		return errors.Join(stopErr, err)
	}
	if _, err := os.Stat(k.p.BPFRoot); err == nil {
		return errors.Join(stopErr, fmt.Errorf("kpr cleanup left %s behind", k.p.BPFRoot))
	}
	return stopErr
}

func (k *kprRun) CgroupPath() string { return "" }

func (k *kprRun) LogTail() string { return tail(k.p.Log(), 30) }

// BPFMapBytes sums the memlock of every map pinned under the BPF root, as
// the kernel accounts it (the "memlock:" line of the map fd's fdinfo).
func (k *kprRun) BPFMapBytes() (*int64, error) {
	entries, err := os.ReadDir(k.p.BPFRoot)
	if err != nil {
		return nil, fmt.Errorf("list kpr's pins: %w", err)
	}
	var total int64
	maps := 0
	for _, e := range entries {
		if e.IsDir() { // links/
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(k.p.BPFRoot, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", e.Name(), err)
		}
		n, err := fdinfoMemlock(m.FD())
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", e.Name(), err)
		}
		total += n
		maps++
	}
	if maps == 0 {
		return nil, fmt.Errorf("no maps pinned under %s", k.p.BPFRoot)
	}
	return &total, nil
}

func fdinfoMemlock(fd int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "memlock:"); ok {
			var n int64
			_, err := fmt.Sscan(strings.TrimSpace(v), &n)
			return n, err
		}
	}
	return 0, errors.New("fdinfo has no memlock line")
}

// kubeProxy is upstream kube-proxy in the node namespace.
type kubeProxy struct {
	cmd     *exec.Cmd
	cgroup  string
	logPath string
	done    chan struct{}
	err     error
}

// kubeProxyConfig is the KubeProxyConfiguration of a run. All conntrack
// settings are zero so kube-proxy writes none of the conntrack sysctls: the
// global ones (nf_conntrack_max, the hash size) belong to the host, and
// the harness must not change them.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
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

func startKubeProxy(mode string, env *NodeEnv, s proxySettings) (*kubeProxy, error) {
	bin := filepath.Join(s.ToolsDir, "kube-proxy")
	cfgPath := filepath.Join(s.LogDir, "kube-proxy-"+mode+".yaml")
	period := kubeProxyMinSync(s.MinSyncPeriod)
	cfg := fmt.Sprintf(kubeProxyConfig, mode, nodeName, s.Kubeconfig, period, period)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	kp := &kubeProxy{logPath: filepath.Join(s.LogDir, "kube-proxy-"+mode+".log"), done: make(chan struct{}), cgroup: s.Cgroup.Path}
	logFile, err := os.Create(kp.logPath)
	if err != nil {
		return nil, err
	}
	// -v=2 logs every sync with its duration: the log explains a slow run.
	kp.cmd = exec.Command(bin, "--config", cfgPath, "-v=2")
	kp.cmd.Stdout, kp.cmd.Stderr = logFile, logFile
	// Its own process group, so Stop also reaches an iptables-restore or
	// nft it is running; born into its own cgroup, so that cgroup's CPU
	// time is kube-proxy's plus its children's.
	kp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, UseCgroupFD: true, CgroupFD: s.Cgroup.FD()}
	// Forked from a thread inside the node namespace: kube-proxy and every
	// iptables/nft it runs see only the node's tables.
	if err := harness.StartCommand(env.Node.NetNS, kp.cmd); err != nil {
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

// kubeProxyMinSync is the min sync period kube-proxy is given for want:
// its configuration reads 0 as "default" (1s), so 0 becomes 1ms, the
// closest it can express.
func kubeProxyMinSync(want time.Duration) time.Duration {
	return max(want, time.Millisecond)
}

func (k *kubeProxy) PID() int { return k.cmd.Process.Pid }

func (k *kubeProxy) Exited() (bool, error) {
	select {
	case <-k.done:
		return true, k.err
	default:
		return false, nil
	}
}

func (k *kubeProxy) Stop() error {
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

func (k *kubeProxy) LogTail() string {
	b, _ := os.ReadFile(k.logPath)
	return tail(string(b), 30)
}

func (k *kubeProxy) BPFMapBytes() (*int64, error) { return nil, nil }

func (k *kubeProxy) CgroupPath() string { return k.cgroup }

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
