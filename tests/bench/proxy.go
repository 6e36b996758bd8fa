package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeproxy"
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

func (k *kprRun) LogTail() string { return kubeproxy.Tail(k.p.Log(), 30) }

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
