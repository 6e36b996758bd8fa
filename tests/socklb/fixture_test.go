// Package socklb tests kpr's socket-level dataplane end to end: the real BPF
// programs attached to a test-owned cgroup, real sockets in network
// namespaces, and backends that say who they are.
package socklb

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

const (
	tcpPort uint16 = 8080
	udpPort uint16 = 5353
)

// fixture is a node namespace with backend pods, and kpr's programs
// attached to a cgroup that holds the test process.
type fixture struct {
	t       testing.TB
	node    *harness.Node
	pods    []*harness.Pod
	cgroup  *harness.Cgroup
	bpfRoot string
	loaded  *loader.Loaded
	lb      *maps.LB
	// socketLB is the mode the hooks load with.
	socketLB loader.SocketLBMode
	// podTC loads the pods' packet path too (loader.PodTC), attached to
	// nothing until a test names devices, in podTCMode.
	podTC     bool
	podTCMode loader.TCAttachMode
	// outside leaves the test process out of the hooks' cgroup: its
	// sockets are a VM's or a sandbox's, which no socket hook sees.
	outside bool
}

func newFixture(t testing.TB, pods int, sizes loader.MapSizes) *fixture {
	t.Helper()
	return newSocketLBFixture(t, pods, sizes, loader.SocketLBAll)
}

// newSocketLBFixture is newFixture with the hooks serving the sockets
// socketLB says.
func newSocketLBFixture(t testing.TB, pods int, sizes loader.MapSizes, socketLB loader.SocketLBMode) *fixture {
	t.Helper()
	return (&fixture{t: t, socketLB: socketLB}).start(pods, sizes)
}

// start builds the node, its backend pods and the dataplane f asks for.
func (f *fixture) start(pods int, sizes loader.MapSizes) *fixture {
	t := f.t
	t.Helper()
	harness.RequireRoot(t)
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.node = node
	for i := 0; i < pods; i++ {
		pod, err := node.AddPod(fmt.Sprintf("backend-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pod.ServeTCP(tcpPort); err != nil {
			t.Fatal(err)
		}
		if _, err := pod.ServeUDP(udpPort); err != nil {
			t.Fatal(err)
		}
		f.pods = append(f.pods, pod)
	}
	if f.cgroup, err = harness.NewCgroup(t); err != nil {
		t.Fatal(err)
	}
	if !f.outside {
		if err := f.cgroup.EnterProcess(); err != nil {
			t.Fatal(err)
		}
	}
	f.bpfRoot = "/sys/fs/bpf/kpr-test-" + randomHex(6)
	// Registered before loading, so it runs after the loaded maps close.
	t.Cleanup(func() {
		if err := loader.Cleanup(f.bpfRoot); err != nil {
			t.Errorf("cleanup of %s: %v", f.bpfRoot, err)
		}
	})
	f.load(sizes)
	return f
}

// load loads (or, the second time, adopts) the dataplane.
func (f *fixture) load(sizes loader.MapSizes) {
	f.t.Helper()
	// The node namespace plays the host network namespace, as it does for
	// every client here that is not a pod.
	opts := loader.Options{BPFRoot: f.bpfRoot, CgroupRoot: f.cgroup.Path, HostNetNS: f.node.NetNS.Path,
		SocketLB: f.socketLB, Sizes: sizes}
	if f.podTC {
		opts.PodTC = &loader.TCOptions{NetNS: f.node.NetNS.Path, Mode: f.podTCMode}
	}
	loaded, err := loader.Load(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { loaded.Close() })
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		f.t.Fatal(err)
	}
	f.loaded, f.lb = loaded, lb
}

// service programs vip:port for proto with the given pods as backends.
func (f *fixture) service(vip netip.Addr, port uint16, proto dataplane.Protocol, pods ...*harness.Pod) maps.Service {
	f.t.Helper()
	svc := maps.Service{VIPKey: maps.VIPKey{VIP: maps.VIP{Addr: vip, Port: port, Proto: proto}}}
	backendPort := tcpPort
	if proto == dataplane.UDP {
		backendPort = udpPort
	}
	for _, p := range pods {
		addr := p.IPv4
		if vip.Is6() && !vip.Is4In6() {
			addr = p.IPv6
		}
		svc.Backends = append(svc.Backends, dataplane.Backend{Addr: addr, Port: backendPort})
	}
	if err := f.lb.Upsert(svc); err != nil {
		f.t.Fatal(err)
	}
	return svc
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// family runs a test body once per IP family with that family's VIP.
type family struct {
	name string
	vip  netip.Addr
}

var families = []family{
	{"IPv4", netip.MustParseAddr("10.96.0.10")},
	{"IPv6", netip.MustParseAddr("fd00:96::10")},
}
