// Package migration tests moving a node from upstream kube-proxy to kpr
// and back (docs/migration.md), and `kpr cleanup --kube-proxy`, against
// real kube-proxy binaries (built by tests/tools) serving a node network
// namespace of the benchmark topology (tests/bench): the API server in an
// infra namespace, the node namespace with backend pods. kpr runs in the
// test's namespace with --host-netns, as in tests/e2e, attached to a
// cgroup holding the test process, whose sockets are the clients.
package migration

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/bench"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
	"github.com/kpr-io/kpr/tests/kubeproxy"
)

// Ports the backend pods serve, and the Service's ports.
const (
	tcpTarget uint16 = 9090
	udpTarget uint16 = 9053
	tcpPort   int32  = 80
	udpPort   int32  = 53
)

// fixture is one node served by a proxy, with a NodePort Service whose
// TCP and UDP ports reach two backend pods.
type fixture struct {
	t        *testing.T
	ctx      context.Context
	infra    *bench.Infra
	env      *bench.NodeEnv
	cgroup   *harness.Cgroup
	toolsDir string
	nodeName string
	nodeIP   netip.Addr
	// The Service's frontends.
	clusterTCP, clusterUDP, nodeTCP, nodeUDP netip.AddrPort
}

func newFixture(t *testing.T) *fixture {
	harness.RequireRoot(t)
	toolsDir, err := kubeproxy.ToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, toolsDir: toolsDir}
	// Sockets are attributed to a cgroup when they are made: the test
	// process enters its cgroup before it opens any.
	if f.cgroup, err = harness.NewCgroup(t); err != nil {
		t.Fatal(err)
	}
	if err := f.cgroup.EnterProcess(); err != nil {
		t.Fatal(err)
	}
	if f.infra, err = bench.StartInfra(t); err != nil {
		t.Fatal(err)
	}
	if f.env, err = f.infra.NewNode(t); err != nil {
		t.Fatal(err)
	}
	nodes, err := f.infra.Cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 || len(nodes.Items[0].Status.Addresses) == 0 {
		t.Fatalf("the topology's Node object: %v (%d nodes)", err, len(nodes.Items))
	}
	f.nodeName = nodes.Items[0].Name
	f.nodeIP = netip.MustParseAddr(nodes.Items[0].Status.Addresses[0].Address)

	backends := f.env.Main[:2]
	var eps []kubeobj.Endpoint
	for _, p := range backends {
		if _, err := p.ServeTCP(tcpTarget); err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeUDP(udpTarget); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, kubeobj.Endpoint{Addr: p.IPv4, NodeName: f.nodeName})
	}
	c := kubeobj.Client{Interface: f.infra.Cluster.Client}
	svc := kubeobj.Service("default", "migrate",
		kubeobj.Port{Name: "tcp", Port: tcpPort, TargetPort: int32(tcpTarget), Protocol: v1.ProtocolTCP},
		kubeobj.Port{Name: "udp", Port: udpPort, TargetPort: int32(udpTarget), Protocol: v1.ProtocolUDP})
	svc.Spec.Type = v1.ServiceTypeNodePort
	if svc, err = c.CreateService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplySlice(ctx, kubeobj.Slice(svc, "migrate-1", discoveryv1.AddressTypeIPv4, eps...)); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr(svc.Spec.ClusterIP)
	for _, p := range svc.Spec.Ports {
		switch p.Protocol {
		case v1.ProtocolTCP:
			f.clusterTCP, f.nodeTCP = netip.AddrPortFrom(vip, uint16(p.Port)), netip.AddrPortFrom(f.nodeIP, uint16(p.NodePort))
		case v1.ProtocolUDP:
			f.clusterUDP, f.nodeUDP = netip.AddrPortFrom(vip, uint16(p.Port)), netip.AddrPortFrom(f.nodeIP, uint16(p.NodePort))
		}
	}
	return f
}

// startKubeProxy starts upstream kube-proxy in mode and waits until it
// serves every frontend.
func (f *fixture) startKubeProxy(mode string) *kubeproxy.Process {
	f.t.Helper()
	kp, err := kubeproxy.Start(f.env.Node.NetNS, kubeproxy.Options{
		ToolsDir: f.toolsDir, Mode: mode, NodeName: f.nodeName, Kubeconfig: f.infra.NodeKubeconfig,
		LogDir: f.t.TempDir(),
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = kp.Stop() })
	if err := f.waitServed(30 * time.Second); err != nil {
		f.t.Fatalf("kube-proxy (%s) does not serve the Service: %v\n%s", mode, err, kp.LogTail())
	}
	return kp
}

// startKPR starts `kpr run` for the node and waits for its first sync.
func (f *fixture) startKPR(args ...string) *kprproc.Process {
	f.t.Helper()
	p, err := kprproc.Start(kprproc.Options{
		Kubeconfig: f.infra.Cluster.KubeconfigPath, NodeName: f.nodeName,
		CgroupRoot: f.cgroup.Path, HostNetNS: f.env.Node.NetNS.Path, Args: args,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if err := p.Cleanup(); err != nil {
			f.t.Error(err)
		}
	})
	if err := p.WaitSynced(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// waitServed waits until new connections reach a backend on every
// frontend.
func (f *fixture) waitServed(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f.checkNewConnections()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkNewConnections opens a new connection to every frontend and
// checks a backend answers, with the frontend as the UDP reply's source.
func (f *fixture) checkNewConnections() error {
	ns := f.env.Node.NetNS
	for _, a := range []netip.AddrPort{f.clusterTCP, f.nodeTCP} {
		if _, err := harness.WhoTCP(ns, a, time.Second); err != nil {
			return err
		}
	}
	for _, a := range []netip.AddrPort{f.clusterUDP, f.nodeUDP} {
		if _, from, err := harness.WhoUDP(ns, a, time.Second); err != nil {
			return err
		} else if from != a {
			return fmt.Errorf("udp %s answered from %s", a, from)
		}
	}
	return nil
}

// cleanupKubeProxy runs kpr with args (`cleanup --kube-proxy` if none)
// on the node, and returns its output.
func (f *fixture) cleanupKubeProxy(args ...string) string {
	f.t.Helper()
	bin, err := kprproc.Binary()
	if err != nil {
		f.t.Fatal(err)
	}
	if len(args) == 0 {
		args = []string{"cleanup", "--kube-proxy"}
	}
	args = append(args, "--host-netns", f.env.Node.NetNS.Path, "--bpf-root", f.t.TempDir())
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		f.t.Fatalf("kpr %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// kubeletChains are KUBE-* chains kube-proxy creates only as copies of
// the kubelet's; they are the kubelet's to remove (see
// iptables-compat/kubeproxy).
var kubeletChains = []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"}

// kubeProxyState lists what of kube-proxy's is in the node's tables:
// KUBE-* chains (but the kubelet's) in both iptables variants and
// families, and kube-proxy nftables tables.
func (f *fixture) kubeProxyState() []string {
	f.t.Helper()
	var found []string
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := f.inNode(save)
		if err != nil {
			continue // that variant or family is not there
		}
		for _, line := range strings.Split(out, "\n") {
			if !strings.HasPrefix(line, ":KUBE-") {
				continue
			}
			chain := strings.Fields(line[1:])[0]
			kubelet := false
			for _, k := range kubeletChains {
				kubelet = kubelet || chain == k
			}
			if !kubelet {
				found = append(found, save+": "+chain)
			}
		}
	}
	out, err := f.inNode("nft", "list", "tables")
	if err != nil {
		f.t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(strings.TrimSpace(line), " kube-proxy") {
			found = append(found, "nft: "+strings.TrimSpace(line))
		}
	}
	return found
}

// inNode runs a command in the node namespace and returns its output.
func (f *fixture) inNode(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out strings.Builder
	cmd.Stdout = &out
	if err := harness.StartCommand(f.env.Node.NetNS, cmd); err != nil {
		return "", err
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("%s in the node namespace: %w", name, err)
	}
	return out.String(), nil
}
