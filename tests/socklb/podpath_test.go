package socklb

import (
	"bufio"
	"errors"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// The pods' packet path (bpf/tc_pod.c, loader.PodTC). Its "VM pod" is a
// pod whose client sockets no socket hook sees: the test process stays
// outside the cgroup kpr's hooks are attached to, as a KubeVirt guest's or
// a gVisor sandbox's sockets are outside the node's kernel. Its packets
// leave the pod addressed to the Service, and only the programs on its
// host-side veth can translate them.

// newPodPathFixture is a node with backends and the pods' programs loaded,
// whose test process is no socket hook's. kpr loads the packet path only
// for the modes that leave pods to it; per-pod it is (the test process
// need not be bypassed: the hooks never see it). A kernel that cannot tell
// pods apart runs per-pod as all, without the packet path: the test is
// skipped there.
func newPodPathFixture(t *testing.T, backends int) *fixture {
	t.Helper()
	return newPodPathFixtureAttached(t, backends, loader.TCAttachAuto)
}

func newPodPathFixtureAttached(t *testing.T, backends int, mode loader.TCAttachMode) *fixture {
	t.Helper()
	requireNetNSCookies(t)
	f := (&fixture{t: t, socketLB: loader.SocketLBPerPod, podTC: true, podTCMode: mode, outside: true}).start(backends, loader.MapSizes{})
	if f.loaded.PodTC == nil {
		t.Fatalf("--socket-lb per-pod loaded as %s without the pods' packet path", f.loaded.SocketLB)
	}
	return f
}

// vmPod adds a pod and puts the pods' programs on its host-side veth.
func (f *fixture) vmPod(t *testing.T, name string) *harness.Pod {
	t.Helper()
	pod, err := f.node.AddPod(name)
	if err != nil {
		t.Fatal(err)
	}
	return f.onPacketPath(t, pod)
}

// onPacketPath adds pod's host-side veth to the packet path's devices.
func (f *fixture) onPacketPath(t *testing.T, pod *harness.Pod) *harness.Pod {
	t.Helper()
	if err := f.loaded.PodTC.SetDevices(append(f.loaded.PodTC.Devices(), pod.HostVeth)); err != nil {
		t.Fatal(err)
	}
	return pod
}

func (f *fixture) podNames() []string {
	var names []string
	for _, p := range f.pods {
		names = append(names, p.Name)
	}
	return names
}

func TestVMPodReachesServicesOnThePacketPath(t *testing.T) {
	f := newPodPathFixture(t, 2)
	for _, fam := range families {
		f.service(fam.vip, tcpPort, dataplane.TCP, f.pods...)
		f.service(fam.vip, udpPort, dataplane.UDP, f.pods...)
	}
	plain, err := f.node.AddPod("plain")
	if err != nil {
		t.Fatal(err)
	}
	vm := f.vmPod(t, "vm")
	backends := f.podNames()

	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			tcp, udp := netip.AddrPortFrom(fam.vip, tcpPort), netip.AddrPortFrom(fam.vip, udpPort)
			// Without the programs on its device a pod outside the
			// hooks reaches nothing: the node has no route for it.
			if who, err := harness.WhoTCP(plain.NetNS, tcp, time.Second); err == nil {
				t.Fatalf("TCP %s from a pod without the programs answered by %s: something else translates", tcp, who)
			}
			seen := map[string]bool{}
			for i := 0; i < 12; i++ {
				who, err := harness.WhoTCP(vm.NetNS, tcp, timeout)
				if err != nil || !slices.Contains(backends, who) {
					t.Fatalf("TCP %s from the VM pod: answered by %q (%v), want one of %v", tcp, who, err, backends)
				}
				seen[who] = true
			}
			if len(seen) < 2 {
				t.Errorf("12 TCP connections to %s all went to %v: the pick is not spread", tcp, seen)
			}
			who, from, err := harness.WhoUDP(vm.NetNS, udp, timeout)
			if err != nil || !slices.Contains(backends, who) {
				t.Fatalf("UDP %s from the VM pod: answered by %q (%v), want one of %v", udp, who, err, backends)
			}
			if from != udp {
				t.Errorf("UDP reply to the VM pod came from %s, want the Service address %s", from, udp)
			}
			if who, err := harness.WhoUDPConnected(vm.NetNS, udp, timeout); err != nil || !slices.Contains(backends, who) {
				t.Errorf("UDP %s over a connected socket from the VM pod: answered by %q (%v)", udp, who, err)
			}
		})
	}
}

// A Service without endpoints refuses a VM pod at once, as kube-proxy's
// REJECT rule does: a TCP connect fails with ECONNREFUSED rather than
// timing out, and a connected UDP socket learns it.
func TestVMPodIsRefusedByAServiceWithoutEndpoints(t *testing.T) {
	f := newPodPathFixture(t, 1)
	for _, fam := range families {
		f.service(fam.vip, tcpPort, dataplane.TCP)
		f.service(fam.vip, udpPort, dataplane.UDP)
	}
	vm := f.vmPod(t, "vm")
	for _, fam := range families {
		tcp, udp := netip.AddrPortFrom(fam.vip, tcpPort), netip.AddrPortFrom(fam.vip, udpPort)
		began := time.Now()
		c, err := harness.DialTCP(vm.NetNS, tcp, 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("TCP %s without endpoints: connected", tcp)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("TCP %s without endpoints: %v, want connection refused", tcp, err)
		}
		if took := time.Since(began); took > time.Second {
			t.Errorf("TCP %s without endpoints was refused after %s, want at once", tcp, took)
		}
		u, err := harness.DialUDP(vm.NetNS, udp)
		if err != nil {
			t.Fatal(err)
		}
		_, err = harness.AskUDP(u, 2*time.Second)
		u.Close()
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP %s without endpoints over a connected socket: %v, want connection refused", udp, err)
		}
	}
}

// A VM pod that is a backend of the Service it asks reaches itself
// (hairpin): the flow is SNATed to the Service address, since a packet
// from its own address would be a martian to it.
func TestVMPodReachesItselfThroughItsService(t *testing.T) {
	f := newPodPathFixture(t, 0)
	vm := f.vmPod(t, "vm")
	if _, err := vm.ServeTCP(tcpPort); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.ServeUDP(udpPort); err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		f.service(fam.vip, tcpPort, dataplane.TCP, vm)
		f.service(fam.vip, udpPort, dataplane.UDP, vm)
	}
	for _, fam := range families {
		tcp, udp := netip.AddrPortFrom(fam.vip, tcpPort), netip.AddrPortFrom(fam.vip, udpPort)
		for i := 0; i < 3; i++ {
			if who, err := harness.WhoTCP(vm.NetNS, tcp, timeout); err != nil || who != vm.Name {
				t.Errorf("TCP %s from the VM pod to itself: answered by %q (%v)", tcp, who, err)
			}
		}
		who, from, err := harness.WhoUDP(vm.NetNS, udp, timeout)
		if err != nil || who != vm.Name || from != udp {
			t.Errorf("UDP %s from the VM pod to itself: answered by %q from %s (%v)", udp, who, from, err)
		}
	}
}

// Where the kernel lacks tcx (before Linux 6.6) the pods' programs are
// clsact filters of their own, apart from the node devices' filters:
// they serve the same, and leave the device bare when the pod is gone
// from the packet path.
func TestVMPodOnClsactFilters(t *testing.T) {
	f := newPodPathFixtureAttached(t, 1, loader.TCAttachLegacy)
	fam := families[0]
	f.service(fam.vip, tcpPort, dataplane.TCP, f.pods...)
	vm := f.vmPod(t, "vm")
	tcp := netip.AddrPortFrom(fam.vip, tcpPort)
	if who, err := harness.WhoTCP(vm.NetNS, tcp, timeout); err != nil || who != f.pods[0].Name {
		t.Fatalf("TCP %s from the VM pod over clsact filters: answered by %q (%v)", tcp, who, err)
	}
	attached, err := loader.PodTCAttachedDevices(f.bpfRoot, f.node.NetNS.Path)
	if err != nil || !slices.Equal(attached, []string{vm.HostVeth}) {
		t.Errorf("pod devices with kpr's filters = %v, %v; want [%s]", attached, err, vm.HostVeth)
	}
	if nodeDevices, err := loader.TCAttachedDevices(f.bpfRoot, f.node.NetNS.Path); err != nil || len(nodeDevices) != 0 {
		t.Errorf("the pods' filters count as the node devices' programs: %v, %v", nodeDevices, err)
	}
	if err := f.loaded.PodTC.SetDevices(nil); err != nil {
		t.Fatal(err)
	}
	qdiscs, err := f.node.NetNS.Netlink().QdiscList(vmLink(t, f, vm))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			t.Errorf("%s kept a clsact qdisc after leaving the packet path", vm.HostVeth)
		}
	}
	if _, err := harness.WhoTCP(vm.NetNS, tcp, time.Second); err == nil {
		t.Errorf("TCP %s from the VM pod still answered after its device left the packet path", tcp)
	}
}

func vmLink(t *testing.T, f *fixture, pod *harness.Pod) netlink.Link {
	t.Helper()
	l, err := f.node.NetNS.Netlink().LinkByName(pod.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A client may reuse a source port at once for a connection to another
// Service: its kernel keeps the closed connection's port only for the
// same destination. When both Services have the same backend, the new
// flow's reply entry is the closed flow's, which must give way; under
// kube-proxy netfilter lets it too. Before, the new SYN was dropped for
// the closed flow's whole closing time.
func TestVMPodReusesASourcePortForAnotherService(t *testing.T) {
	f := newPodPathFixture(t, 1)
	vip1, vip2 := netip.MustParseAddr("10.96.0.21"), netip.MustParseAddr("10.96.0.22")
	f.service(vip1, tcpPort, dataplane.TCP, f.pods...)
	f.service(vip2, tcpPort, dataplane.TCP, f.pods...)
	vm := f.vmPod(t, "vm")
	const port = 40123
	dial := func(to netip.Addr) error {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{Port: port},
			// The first connection's TIME_WAIT holds the port for its own
			// destination only.
			Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
				return errors.Join(err, serr)
			}}
		return harness.Do(vm.NetNS, func() error {
			c, err := d.Dial("tcp", netip.AddrPortFrom(to, tcpPort).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
	}
	if err := dial(vip1); err != nil {
		t.Fatalf("first connection, from port %d to %s: %v", port, vip1, err)
	}
	// Past the closed flow's last packets (CT_CLOSED_IDLE_NS, 200 ms).
	time.Sleep(300 * time.Millisecond)
	if err := dial(vip2); err != nil {
		t.Errorf("a connection from the same port %d to %s, another Service with the same backend: %v", port, vip2, err)
	}
}

// On a routed CNI (Calico's: no bridge, a host route per pod, proxy ARP)
// the programs sit on the pod's veth as on a bridge CNI's: a VM pod
// reaches a Service, and itself through it.
func TestVMPodOnARoutedCNI(t *testing.T) {
	f := newPodPathFixture(t, 1)
	vm, err := f.node.AddRoutedPod("vm")
	if err != nil {
		t.Fatal(err)
	}
	f.onPacketPath(t, vm)
	if _, err := vm.ServeTCP(tcpPort); err != nil {
		t.Fatal(err)
	}
	self := netip.MustParseAddr("10.96.0.30")
	for _, fam := range families {
		f.service(fam.vip, tcpPort, dataplane.TCP, f.pods...)
	}
	f.service(self, tcpPort, dataplane.TCP, vm)
	for _, fam := range families {
		tcp := netip.AddrPortFrom(fam.vip, tcpPort)
		if who, err := harness.WhoTCP(vm.NetNS, tcp, timeout); err != nil || who != f.pods[0].Name {
			t.Errorf("TCP %s from a routed VM pod: answered by %q (%v), want %s", tcp, who, err, f.pods[0].Name)
		}
	}
	if who, err := harness.WhoTCP(vm.NetNS, netip.AddrPortFrom(self, tcpPort), timeout); err != nil || who != vm.Name {
		t.Errorf("TCP %s from the routed VM pod to itself: answered by %q (%v)", self, who, err)
	}
}
