package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeproxy"
)

// Proxy names, as they appear in results and plots.
const (
	ProxyKPR = "kpr"
	// ProxyKPRIPTables is kpr's iptables fallback (`kpr run --mode
	// iptables`), measured against kube-proxy's iptables mode.
	ProxyKPRIPTables = "kpr-iptables"
	ProxyIPTables    = "kube-proxy-iptables"
	// ProxyKPRNFTables is kpr's nftables mode (`kpr run --mode
	// nftables`), measured against kube-proxy's nftables mode.
	ProxyKPRNFTables = "kpr-nftables"
	ProxyNFTables    = "kube-proxy-nftables"
)

// AllProxies is every proxy the harness can run, in run order: each of
// kpr's netfilter modes runs just before kube-proxy's same mode, so that
// the two judged against each other see the machine in about the same
// state.
//
// The IPVS modes (kpr's and kube-proxy's) are not here: the machine the
// benchmark runs on has no ip_vs in its kernel, and a proxy that cannot
// run there would only produce a failed run (see notMeasured).
var AllProxies = []string{ProxyKPR, ProxyKPRIPTables, ProxyIPTables, ProxyKPRNFTables, ProxyNFTables}

// notMeasured names the proxies the issues ask for that the harness does
// not run, with why, for the report.
var notMeasured = []string{"kpr-ipvs and kube-proxy-ipvs (IPVS needs the kernel's ip_vs module, which the benchmark machine lacks; the IPVS mode is tested in the kernel-matrix VM instead)"}

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
	// Cgroup is an empty cgroup of the proxy's own, for kube-proxy or
	// kpr's netfilter modes and the iptables/nft children they run (their
	// CPU time).
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
	// "" when it runs in the client's cgroup (kpr's eBPF mode, which runs
	// no children).
	CgroupPath() string
}

// startProxy starts the named proxy inside env's node namespace.
func startProxy(name string, env *NodeEnv, s proxySettings) (runningProxy, error) {
	switch name {
	case ProxyKPR:
		return startKPR("ebpf", env, s)
	case ProxyKPRIPTables:
		return startKPR("iptables", env, s)
	case ProxyIPTables:
		return startKubeProxy("iptables", env, s)
	case ProxyKPRNFTables:
		return startKPR("nftables", env, s)
	case ProxyNFTables:
		return startKubeProxy("nftables", env, s)
	}
	return nil, fmt.Errorf("unknown proxy %q (known: %s)", name, strings.Join(AllProxies, ", "))
}

// kprRun is `kpr run` in the node namespace, pinned under a fresh
// /sys/fs/bpf/kpr-bench-<random>. The eBPF mode attaches to the client
// cgroup and runs in it; the netfilter modes run in a cgroup of their
// own, whose CPU time includes their iptables-restore children.
type kprRun struct {
	p       *kprproc.Process
	mode    string
	env     *NodeEnv
	cg      *harness.Cgroup // a netfilter mode's own; nil for eBPF
	stopped bool
}

// startKPR runs kpr in mode ("ebpf", "iptables" or "nftables"). The mode is explicit:
// under the default auto, a kernel without the eBPF hooks would silently
// turn the eBPF run into an iptables one.
func startKPR(mode string, env *NodeEnv, s proxySettings) (*kprRun, error) {
	// Build outside the node namespace, which has no route to anywhere a
	// build could need.
	if _, err := kprproc.Binary(); err != nil {
		return nil, err
	}
	args := []string{"--mode", mode, "--min-sync-period", s.MinSyncPeriod.String()}
	// Every Service takes a master entry plus one slot per endpoint.
	if need := uint32(s.Services*(backendsPerGroup+1) + 1024); mode == "ebpf" && need > 262144 {
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
	k := &kprRun{mode: mode, env: env}
	if mode != "ebpf" && s.Cgroup != nil {
		opts.CgroupFD, k.cg = s.Cgroup.FD(), s.Cgroup
	}
	// The child is forked from a thread inside the node namespace and
	// stays there; its health and metrics ports are the node's, and the
	// netfilter modes program the node's tables, as a DaemonSet's kpr
	// programs its node's.
	err := harness.Do(env.Node.NetNS, func() error {
		var err error
		k.p, err = kprproc.Start(opts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start kpr --mode %s in %s: %w", mode, env.Node.NetNS.Name, err)
	}
	return k, nil
}

func (k *kprRun) PID() int { return k.p.PID() }

func (k *kprRun) Exited() (bool, error) { return k.p.Exited(), nil }

func (k *kprRun) Stop() error {
	if k.stopped {
		return nil
	}
	k.stopped = true
	stopErr := k.p.Stop()
	// kpr killed after ignoring SIGTERM for 10s (it does while a
	// 10,000-Service iptables-restore runs) leaves that child running:
	// whatever is left in kpr's own cgroup is its children.
	if k.cg != nil {
		pids, err := k.cg.PIDs()
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		stopErr = errors.Join(stopErr, err)
	}
	// Cleanup detaches the programs from the client cgroup and removes
	// the pins, so the next proxy run starts from nothing. It runs in the
	// node namespace, as kpr did: `kpr cleanup` also removes the netfilter
	// chains of its namespace, which must be the node's, never the host's.
	if err := harness.Do(k.env.Node.NetNS, k.p.Cleanup); err != nil {
		return errors.Join(stopErr, err)
	}
	if _, err := os.Stat(k.p.BPFRoot); err == nil {
		return errors.Join(stopErr, fmt.Errorf("kpr cleanup left %s behind", k.p.BPFRoot))
	}
	return stopErr
}

func (k *kprRun) CgroupPath() string {
	if k.cg == nil {
		return ""
	}
	return k.cg.Path
}

func (k *kprRun) LogTail() string { return kubeproxy.Tail(k.p.Log(), 30) }

// BPFMapBytes sums the memlock of every map pinned under the BPF root, as
// the kernel accounts it (the "memlock:" line of the map fd's fdinfo); nil
// for the netfilter modes, which have no maps.
func (k *kprRun) BPFMapBytes() (*int64, error) {
	if k.mode != "ebpf" {
		return nil, nil
	}
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
type kubeProxy struct{ *kubeproxy.Process }

// kubeProxyMinSync is the min sync period kube-proxy is given for a run's.
var kubeProxyMinSync = kubeproxy.MinSync

func startKubeProxy(mode string, env *NodeEnv, s proxySettings) (*kubeProxy, error) {
	p, err := kubeproxy.Start(env.Node.NetNS, kubeproxy.Options{
		ToolsDir: s.ToolsDir, Mode: mode, NodeName: nodeName, Kubeconfig: s.Kubeconfig,
		MinSyncPeriod: s.MinSyncPeriod, LogDir: s.LogDir, Cgroup: s.Cgroup,
	})
	if err != nil {
		return nil, err
	}
	return &kubeProxy{p}, nil
}

func (k *kubeProxy) BPFMapBytes() (*int64, error) { return nil, nil }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
