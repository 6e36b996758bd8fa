// Package e2e tests `kpr run` end to end: the real binary as a child
// process, a real kube-apiserver and etcd, Services and EndpointSlices
// written through client-go, and clients and backends in network
// namespaces whose sockets are translated by kpr's BPF programs.
//
// There is no controller manager and no kubelet: the tests write the
// EndpointSlices an EndpointSlice controller would write, and the Node
// object kpr looks up for its node name, zone and NodePort addresses.
//
// Each top-level test builds one fixture (API server, node namespace with
// backend pods, a cgroup holding the test process, kpr attached to it) and
// runs its scenarios as subtests in their own Kubernetes namespaces, so the
// API server start (the slow part) is paid once per group.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// The simulated node as the API knows it.
const (
	nodeName  = "kpr-e2e-node"
	otherNode = "kpr-e2e-elsewhere" // endpoints "on another node"
	nodeZone  = "zone-a"
	otherZone = "zone-b"
)

// nodeIP is the node's InternalIP, added to the node namespace's uplink so
// that NodePort frontends exist and can be connected to.
var nodeIP = netip.MustParsePrefix("192.168.77.10/24")

// Ports every backend pod serves: a TCP echo server announcing the pod, an
// HTTP server (a different protocol, so a Service port that lands on the
// wrong target port fails visibly) and a UDP echo server.
const (
	tcpPort  uint16 = 8080
	httpPort uint16 = 8081
	udpPort  uint16 = 5353
)

// podNames are the backend pods of every fixture.
var podNames = []string{"pod-a", "pod-b", "pod-c", "pod-d"}

// fixture is one API server, one node with backend pods, and kpr running
// against both.
type fixture struct {
	t       *testing.T
	ctx     context.Context
	cluster *cluster.Cluster
	client  kubeobj.Client
	node    *harness.Node
	pods    map[string]*harness.Pod
	cgroup  *harness.Cgroup
	kpr     *kprproc.Process
	// mode is the dataplane kpr runs.
	mode dataMode
	// clientNS is where the Service scenarios' client sockets live: the
	// node's own namespace, or under modePacketPath a pod the socket
	// hooks leave to the packet path.
	clientNS *harness.NetNS
}

// newFixture starts everything, kpr in the eBPF mode. kprArgs are extra
// `kpr run` flags.
func newFixture(t *testing.T, kprArgs ...string) *fixture {
	t.Helper()
	return newModeFixture(t, modeEBPF, kprArgs...)
}

// newModeFixture starts everything, kpr in mode m.
func newModeFixture(t *testing.T, m dataMode, kprArgs ...string) *fixture {
	t.Helper()
	harness.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, pods: map[string]*harness.Pod{}, mode: m}

	// The API server's graceful shutdown waits up to --request-timeout for
	// open watches (kpr's); the default 60s would stall every outage.
	f.cluster = cluster.StartForTest(t, cluster.Options{APIServerArgs: map[string]string{"request-timeout": "5s"}})
	f.client = kubeobj.Client{Interface: f.cluster.Client}

	var err error
	if f.node, err = harness.NewNode(t, harness.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := f.node.AddAddress(nodeIP); err != nil {
		t.Fatal(err)
	}
	for _, name := range podNames {
		pod, err := f.node.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		_, errTCP := pod.ServeTCP(tcpPort)
		_, errHTTP := pod.ServeHTTP(httpPort)
		_, errUDP := pod.ServeUDP(udpPort)
		if err := errors.Join(errTCP, errHTTP, errUDP); err != nil {
			t.Fatal(err)
		}
		f.pods[name] = pod
	}
	f.prepareNode(m)
	if err := f.cluster.CreateNode(ctx, nodeName, []string{nodeIP.Addr().String()},
		map[string]string{v1.LabelTopologyZone: nodeZone, v1.LabelHostname: nodeName}); err != nil {
		t.Fatal(err)
	}

	// The test process (and so kpr, its child) lives in a cgroup of its
	// own, and kpr attaches its programs there: only this test's sockets
	// are translated.
	if f.cgroup, err = harness.NewCgroup(t); err != nil {
		t.Fatal(err)
	}
	if err := f.cgroup.EnterProcess(); err != nil {
		t.Fatal(err)
	}
	f.kpr, err = kprproc.Start(kprproc.Options{
		Kubeconfig: f.cluster.KubeconfigPath,
		NodeName:   nodeName,
		CgroupRoot: f.cgroup.Path,
		// The node namespace is the host network namespace of the
		// simulated node (kpr itself runs in the test's, where the API
		// server is): loopback NodePorts are its sockets' alone, and the
		// iptables mode programs its tables, never the test's.
		HostNetNS: f.node.NetNS.Path,
		Args:      append(append([]string{}, m.args...), kprArgs...),
		LogPath:   filepath.Join(t.TempDir(), "kpr.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the cgroup: runs before its removal, so the kpr
	// process is gone and its links detached by then.
	t.Cleanup(func() {
		if t.Failed() {
			if f.kpr.Exited() {
				t.Logf("kpr had exited before the cleanup: %v", f.kpr.ExitError())
			}
			t.Logf("kpr log (last 60 lines):\n%s", lastLines(f.kpr.Log(), 60))
		}
		if err := f.kpr.Cleanup(); err != nil {
			t.Errorf("kpr cleanup: %v", err)
		}
	})
	f.waitHealthy()
	f.clientNS = f.node.NetNS
	if m.packetPath {
		f.clientNS = f.bypassedPod(t, "client").NetNS
	}
	return f
}

// waitHealthy waits until kpr's /healthz answers 200.
func (f *fixture) waitHealthy() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	if err := f.kpr.WaitSynced(ctx); err != nil {
		f.t.Fatal(err)
	}
}

// healthz returns the status code of kpr's /healthz, or an error if it
// does not answer.
func (f *fixture) healthz() (int, error) { return f.kpr.Probe("/healthz") }

// requireRunning fails the test if kpr has exited.
func (f *fixture) requireRunning(t *testing.T) {
	t.Helper()
	if f.kpr.Exited() {
		t.Fatalf("kpr exited; last lines of its log:\n%s", lastLines(f.kpr.Log(), 40))
	}
}

// namespace creates a Kubernetes namespace for one scenario, so scenarios
// never share object names. (Without a namespace controller a deleted
// namespace would never go away, so they are left to the API server's end.)
func (f *fixture) namespace(t *testing.T, name string) string {
	t.Helper()
	_, err := f.client.CoreV1().Namespaces().Create(f.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// createService creates svc and returns it as stored, with its ClusterIPs
// and NodePorts.
func (f *fixture) createService(t *testing.T, svc *v1.Service) *v1.Service {
	t.Helper()
	out, err := f.client.CreateService(f.ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// updateService re-reads the Service, applies mutate and writes it back.
func (f *fixture) updateService(t *testing.T, svc *v1.Service, mutate func(*v1.Service)) *v1.Service {
	t.Helper()
	api := f.client.CoreV1().Services(svc.Namespace)
	cur, err := api.Get(f.ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	mutate(cur)
	out, err := api.Update(f.ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

// setEndpoints writes the slice <svc>-<family> of svc with the given
// endpoints (replacing it if it exists), as an EndpointSlice controller
// would.
func (f *fixture) setEndpoints(t *testing.T, svc *v1.Service, family discoveryv1.AddressType, eps ...kubeobj.Endpoint) *discoveryv1.EndpointSlice {
	t.Helper()
	s := kubeobj.Slice(svc, svc.Name+"-"+strings.ToLower(string(family)), family, eps...)
	f.applySlice(t, s)
	return s
}

func (f *fixture) applySlice(t *testing.T, s *discoveryv1.EndpointSlice) {
	t.Helper()
	if err := f.client.ApplySlice(f.ctx, s); err != nil {
		t.Fatal(err)
	}
}

// pod returns the fixture's backend pod called name (one of podNames).
func (f *fixture) pod(name string) *harness.Pod {
	p, ok := f.pods[name]
	if !ok {
		// A typo in a test, not a test failure; t.Fatal would also be
		// wrong from a subtest's goroutine.
		panic(fmt.Sprintf("no pod %q in the fixture; pods are %v", name, podNames))
	}
	return p
}

// ep returns the endpoint of a pod in one address family; mods adjust
// conditions, node name or hints.
func (f *fixture) ep(name string, family discoveryv1.AddressType, mods ...func(*kubeobj.Endpoint)) kubeobj.Endpoint {
	p := f.pod(name)
	e := kubeobj.Endpoint{Addr: p.IPv4}
	if family == discoveryv1.AddressTypeIPv6 {
		e.Addr = p.IPv6
	}
	for _, m := range mods {
		m(&e)
	}
	return e
}

// eps returns the IPv4 endpoints of the named pods.
func (f *fixture) eps(names ...string) []kubeobj.Endpoint {
	out := make([]kubeobj.Endpoint, 0, len(names))
	for _, n := range names {
		out = append(out, f.ep(n, discoveryv1.AddressTypeIPv4))
	}
	return out
}

// Endpoint modifiers.
func onNode(node string) func(*kubeobj.Endpoint) {
	return func(e *kubeobj.Endpoint) { e.NodeName = node }
}

func conditions(ready, serving, terminating bool) func(*kubeobj.Endpoint) {
	return func(e *kubeobj.Endpoint) {
		e.Ready, e.Serving, e.Terminating = kubeobj.Bool(ready), kubeobj.Bool(serving), kubeobj.Bool(terminating)
	}
}

func zoneHints(zones ...string) func(*kubeobj.Endpoint) {
	return func(e *kubeobj.Endpoint) { e.ZoneHints = zones }
}

func nodeHints(nodes ...string) func(*kubeobj.Endpoint) {
	return func(e *kubeobj.Endpoint) { e.NodeHints = nodes }
}

// clusterIP returns the Service's ClusterIP of one family with a port.
func clusterIP(t *testing.T, svc *v1.Service, family v1.IPFamily, port uint16) netip.AddrPort {
	t.Helper()
	a, err := kubeobj.ClusterIP(svc, family)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(a, port)
}

// dump returns kpr's maps as `kpr dump -o json` shows them.
func (f *fixture) dump(t *testing.T) []kprproc.DumpService {
	t.Helper()
	d, err := f.kpr.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// dumpJSON is dump as one comparable string.
func (f *fixture) dumpJSON(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(f.dump(t))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// frontendsOf returns the dump entries whose frontend address is addr.
func frontendsOf(d []kprproc.DumpService, addr netip.Addr) []kprproc.DumpService {
	var out []kprproc.DumpService
	for _, s := range d {
		if ap, err := netip.ParseAddrPort(s.Frontend); err == nil && ap.Addr() == addr {
			out = append(out, s)
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitUntil polls cond every 20ms until it returns nil, and fails the test
// with cond's last error once timeout has passed.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var errNotYet = errors.New("not yet")
