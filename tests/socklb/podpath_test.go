package socklb

import (
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

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
// whose test process is no socket hook's.
func newPodPathFixture(t *testing.T, backends int) *fixture {
	t.Helper()
	return (&fixture{t: t, socketLB: loader.SocketLBAll, podTC: true, outside: true}).start(backends, loader.MapSizes{})
}

// vmPod adds a pod and puts the pods' programs on its host-side veth.
func (f *fixture) vmPod(t *testing.T, name string) *harness.Pod {
	t.Helper()
	pod, err := f.node.AddPod(name)
	if err != nil {
		t.Fatal(err)
	}
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
