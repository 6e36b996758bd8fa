package ipvs

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/tests/namedns"
)

// newIPVSNode is newNamedNetNS with the sysctls the IPVS mode sets.
func newIPVSNode(t *testing.T) (*NetlinkKernel, netfilter.Runner, string) {
	t.Helper()
	k, run, node := newNamedNetNS(t)
	if err := exec.Command("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.vs.conntrack=1", "net.ipv4.ip_forward=1").Run(); err != nil {
		t.Fatalf("sysctl in %s: %v", node, err)
	}
	return k, run, node
}

// ipv4Plane is a Plane of o that programs IPv4 with iptables-nft.
func ipv4Plane(t *testing.T, o Options) *Plane {
	t.Helper()
	o.Log = zaptest.NewLogger(t)
	o.Families = map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// podNetNS creates a "pod" namespace wired to the node namespace by a veth
// pair, 10.244.0.0/24 between them (node .254, pod addr), and returns its
// path.
func podNetNS(t *testing.T, node, addr string) string {
	t.Helper()
	return peerNetNS(t, node, "10.244.0.254/24", addr+"/24", "10.244.0.254")
}

// peerNetNS creates a namespace wired to the node namespace by a veth
// pair, nodeAddr on the node's end, addr on its own, its default route
// via gw, and returns its path.
func peerNetNS(t *testing.T, node, nodeAddr, addr, gw string) string {
	t.Helper()
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := "kpr-ipvs-pod-" + hex.EncodeToString(suffix)
	h, err := namedns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	t.Cleanup(func() {
		if err := namedns.Delete(name); err != nil {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	veth := "kv" + hex.EncodeToString(suffix)
	for _, c := range [][]string{
		{"ip", "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"ip", "-n", node, "addr", "add", nodeAddr, "dev", veth},
		{"ip", "-n", node, "link", "set", veth, "up"},
		{"ip", "-n", name, "addr", "add", addr, "dev", "eth0"},
		{"ip", "-n", name, "link", "set", "eth0", "up"},
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "route", "add", "default", "via", gw},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return namedns.Path(name)
}

// serveName listens on port in the namespace at path and answers every
// connection with name.
func serveName(t *testing.T, path string, port int, name string) {
	t.Helper()
	serve(t, path, port, func(net.Conn) string { return name })
}

// serveSource listens on port in the namespace at path and answers every
// connection with the address it came from.
func serveSource(t *testing.T, path string, port int) {
	t.Helper()
	serve(t, path, port, func(c net.Conn) string { return c.RemoteAddr().(*net.TCPAddr).IP.String() })
}

// serve listens on port in the namespace at path and answers every
// connection with the line answer returns for it.
func serve(t *testing.T, path string, port int, answer func(net.Conn) string) {
	t.Helper()
	var l net.Listener
	if err := netnsexec.InPath(path, func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, answer(c))
			c.Close()
		}
	}()
}

// ask connects from the namespace at path to addr and returns the answer.
func ask(path, addr string) (string, error) {
	var c net.Conn
	if err := netnsexec.InPath(path, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// Real connections through the kernel's IPVS: the node's own connection
// to a ClusterIP reaches the pod behind it (the virtual address is bound
// to kpr-ipvs0, IPVS picks the real server, the masquerade rules give the
// pod an address to answer), and under externalTrafficPolicy Local the
// node's own connection to a NodePort reaches every endpoint through its
// fwmark virtual server, while the address's virtual server has only the
// local one.
func TestConnectionsThroughIPVS(t *testing.T) {
	k, run, node := newIPVSNode(t)
	nodePath := namedns.Path(node)
	pod1 := podNetNS(t, node, "10.244.0.1")
	serveName(t, pod1, 8080, "pod1")

	p := ipv4Plane(t, Options{Kernel: k, Runner: run})
	web := dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP}
	sp := &dataplane.ServicePort{Name: web, Frontends: []dataplane.Frontend{
		fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backends("10.244.0.1:8080"), nil),
		// The node's own traffic gets every endpoint (pod1), outside
		// traffic the local ones (none).
		fe(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, backends("10.244.0.1:8080"), backends()),
	}}
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{web: sp}); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"10.96.0.1:80", "192.168.1.10:30080"} {
		got, err := ask(nodePath, addr)
		if err != nil || got != "pod1" {
			t.Errorf("the node's connection to %s: %q, %v; want pod1's answer", addr, got, err)
		}
	}
	// Without endpoints IPVS answers with port unreachable.
	empty := &dataplane.ServicePort{Name: web, Frontends: []dataplane.Frontend{
		fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, nil, nil)}}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web: empty}); err != nil {
		t.Fatal(err)
	}
	if got, err := ask(nodePath, "10.96.0.1:80"); err == nil {
		t.Errorf("a connection to a ClusterIP without endpoints got %q, want it refused", got)
	}
}

// A client outside the node reaches a LoadBalancer IP only from inside
// the Service's loadBalancerSourceRanges: filter drops the others before
// IPVS sees them.
func TestSourceRangesThroughIPVS(t *testing.T) {
	k, run, node := newIPVSNode(t)
	pod1 := podNetNS(t, node, "10.244.0.1")
	serveName(t, pod1, 8080, "pod1")
	client := peerNetNS(t, node, "192.0.2.254/24", "192.0.2.2/24", "192.0.2.254")

	p := ipv4Plane(t, Options{Kernel: k, Runner: run})
	web := dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP}
	fenced := func(ranges ...string) *dataplane.ServicePort {
		sp := &dataplane.ServicePort{Name: web, Frontends: []dataplane.Frontend{
			fe(dataplane.LoadBalancer, "198.51.100.10:80", dataplane.TCP, backends("10.244.0.1:8080"), nil)}}
		for _, r := range ranges {
			sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(r))
		}
		return sp
	}
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{web: fenced("192.0.2.0/24")}); err != nil {
		t.Fatal(err)
	}
	if got, err := ask(client, "198.51.100.10:80"); err != nil || got != "pod1" {
		t.Errorf("a client inside the source ranges got %q, %v; want pod1's answer", got, err)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web: fenced("10.0.0.0/8")}); err != nil {
		t.Fatal(err)
	}
	if got, err := ask(client, "198.51.100.10:80"); err == nil {
		t.Errorf("a client outside the source ranges got %q, want its connection dropped", got)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web: fenced()}); err != nil {
		t.Fatal(err)
	}
	if got, err := ask(client, "198.51.100.10:80"); err != nil || got != "pod1" {
		t.Errorf("without source ranges a client got %q, %v; want pod1's answer", got, err)
	}
}

// A pod's connection to a ClusterIP, from inside --cluster-cidr, reaches
// the backend with the pod's own address, and with --masquerade-all with
// the node's: the backend answers the node, as kube-proxy's IPVS mode
// makes it.
func TestMasqueradeAllThroughIPVS(t *testing.T) {
	for _, c := range []struct {
		masqAll bool
		source  string
	}{
		{false, "10.244.1.2"},  // the client pod
		{true, "10.244.0.254"}, // the node, on the backend's link
	} {
		t.Run(fmt.Sprintf("masquerade-all=%v", c.masqAll), func(t *testing.T) {
			k, run, node := newIPVSNode(t)
			backend := podNetNS(t, node, "10.244.0.1")
			serveSource(t, backend, 8080)
			// Another pod, on another link: its traffic to the backend
			// passes the node, which forwards it unmasqueraded.
			client := peerNetNS(t, node, "10.244.1.254/24", "10.244.1.2/24", "10.244.1.254")

			p := ipv4Plane(t, Options{Kernel: k, Runner: run,
				Masquerade: netfilter.Masquerade{All: c.masqAll, Local: netfilter.LocalTraffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}}})
			web := dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP}
			sp := &dataplane.ServicePort{Name: web, Frontends: []dataplane.Frontend{
				fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backends("10.244.0.1:8080"), nil)}}
			if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{web: sp}); err != nil {
				t.Fatal(err)
			}
			if got, err := ask(client, "10.96.0.1:80"); err != nil || got != c.source {
				t.Errorf("the backend saw the pod's connection to the ClusterIP come from %q (%v), want %s", got, err, c.source)
			}
		})
	}
}

// The Service addresses on kpr-ipvs0 are the node's own: a client outside
// the node that connects to a ClusterIP or load-balancer IP on a port no
// Service has (sshd's, the kubelet's) is refused by KPR-IPVS-FILTER, as by
// kube-proxy's KUBE-IPVS-FILTER (kubernetes#72236), while the Service's
// own port reaches the pod, its healthCheckNodePort the node's health
// server, and the node's address still reaches the node's listener.
func TestHostPortsAreNotExposedOnServiceAddresses(t *testing.T) {
	k, run, node := newIPVSNode(t)
	nodePath := namedns.Path(node)
	pod1 := podNetNS(t, node, "10.244.0.1")
	serveName(t, pod1, 8080, "pod1")
	// A daemon of the node's that listens on every address, and kpr's
	// health server for the Service's healthCheckNodePort.
	serveName(t, nodePath, 2222, "node sshd")
	serveName(t, nodePath, 32100, "health check")
	client := peerNetNS(t, node, "192.0.2.254/24", "192.0.2.2/24", "192.0.2.254")

	p := ipv4Plane(t, Options{Kernel: k, Runner: run})
	web := dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP}
	sp := &dataplane.ServicePort{Name: web, HealthCheckNodePort: 32100, Frontends: []dataplane.Frontend{
		fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backends("10.244.0.1:8080"), nil),
		fe(dataplane.LoadBalancer, "198.51.100.10:80", dataplane.TCP, backends("10.244.0.1:8080"), backends("10.244.0.1:8080"))}}
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{web: sp}); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []string{"10.96.0.1", "198.51.100.10"} {
		if got, err := ask(client, vip+":80"); err != nil || got != "pod1" {
			t.Errorf("a client's connection to the Service port %s:80 got %q, %v; want pod1's answer", vip, got, err)
		}
		if got, err := ask(client, vip+":2222"); err == nil {
			t.Errorf("a client reached the node's port 2222 on the Service address %s: %q; want it refused", vip, got)
		}
		// A cloud load balancer probes the healthCheckNodePort at the
		// Service's address (kube-proxy's KUBE-HEALTH-CHECK-NODE-PORT).
		if got, err := ask(client, vip+":32100"); err != nil || got != "health check" {
			t.Errorf("a probe of the healthCheckNodePort at %s:32100 got %q, %v; want the node's health server", vip, got, err)
		}
	}
	if got, err := ask(client, "192.0.2.254:2222"); err != nil || got != "node sshd" {
		t.Errorf("a client's connection to the node's own address got %q, %v; want the node's listener", got, err)
	}
	// Once the Service is gone its addresses are neither bound nor
	// filtered.
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web: nil}); err != nil {
		t.Fatal(err)
	}
	entries, _, err := k.SetEntries(setName(setBound, false))
	if err != nil || len(entries) != 0 {
		t.Errorf("%s holds %v (%v) after the last Service left; want it empty", setName(setBound, false), entries, err)
	}
}
