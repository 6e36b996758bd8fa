package socklb

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/ebpfplane/sockterm"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// newSockTermFixture is a fixture with a client pod and a Plane that
// destroys the UDP sockets of removed backends. The client pod's network
// namespace is held by a process in kpr's cgroup, as a pod's pause
// container holds its namespace: that is how the terminator finds it.
func newSockTermFixture(t *testing.T) (*fixture, *harness.Pod, *ebpfplane.Plane) {
	t.Helper()
	f := newFixture(t, 3, loader.MapSizes{})
	if f.loaded.SockTerm == nil {
		t.Skipf("kernel %s cannot destroy UDP sockets (%q unsupported, see `kpr probe`): needs iter/udp and bpf_sock_destroy, Linux 6.5+",
			f.loaded.Features.Kernel, loader.FeatureUDPSockTerm)
	}
	client, err := f.node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	pause := exec.Command("sleep", "3600")
	if err := harness.StartCommand(client.NetNS, pause); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pause.Process.Kill()
		_ = pause.Wait()
	})
	plane := ebpfplane.New(f.lb, nil)
	plane.SetSocketTerminator(sockterm.New(f.loaded.SockTerm, maps.NewSockTermTargets(f.loaded.SockTermTargets), f.cgroup.Path, nil))
	return f, client, plane
}

// applyUDP makes vip a UDP ClusterIP served by pods; no pods deletes it.
func applyUDP(t *testing.T, plane *ebpfplane.Plane, vip netip.AddrPort, pods ...*harness.Pod) {
	t.Helper()
	name := dataplane.ServicePortName{Namespace: "default", Name: "dns-" + vip.Addr().String(), Protocol: dataplane.UDP}
	var sp *dataplane.ServicePort
	if len(pods) > 0 {
		fe := dataplane.Frontend{Addr: vip.Addr(), Port: vip.Port(), Protocol: dataplane.UDP, Kind: dataplane.ClusterIP}
		for _, p := range pods {
			fe.Backends = append(fe.Backends, dataplane.Backend{Addr: podAddr(p, vip.Addr()), Port: udpPort})
		}
		sp = &dataplane.ServicePort{Frontends: []dataplane.Frontend{fe}}
	}
	if err := plane.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name: sp}); err != nil {
		t.Fatal(err)
	}
}

// podAddr is p's address of the family of like.
func podAddr(p *harness.Pod, like netip.Addr) netip.Addr {
	if like.Is4() {
		return p.IPv4
	}
	return p.IPv6
}

func dialUDP(t *testing.T, ns *harness.NetNS, to netip.AddrPort) *net.UDPConn {
	t.Helper()
	c, err := harness.DialUDP(ns, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ask sends one datagram on a connected socket and returns the name of the
// backend that answered.
func ask(c *net.UDPConn) (string, error) { return harness.AskUDP(c, timeout) }

func mustAsk(t *testing.T, c *net.UDPConn, what string) string {
	t.Helper()
	who, err := ask(c)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return who
}

// expectDestroyed checks that c was destroyed: its next receive fails with
// ECONNABORTED and it can no longer send to the old backend.
func expectDestroyed(t *testing.T, c *net.UDPConn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(timeout))
	_, err := c.Read(make([]byte, 512))
	if !errors.Is(err, syscall.ECONNABORTED) {
		t.Fatalf("%s: receive after its backend left returned %v, want ECONNABORTED (the socket was not destroyed)", what, err)
	}
	if who, err := ask(c); err == nil {
		t.Fatalf("%s: the destroyed socket still reached %s", what, who)
	}
}

// A connected UDP socket whose backend leaves the Service is destroyed;
// one whose backend stays, and one connected to the pod IP directly, are
// not; a new socket reaches a live backend.
func TestUDPSocketOfRemovedBackendIsDestroyed(t *testing.T) {
	f, client, plane := newSockTermFixture(t)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			vip := netip.AddrPortFrom(fam.vip, 53)
			leaving, staying, joining := f.pods[0], f.pods[1], f.pods[2]
			applyUDP(t, plane, vip, leaving, staying)

			// One socket on each backend (a socket's backend follows its cookie).
			on := map[string]*net.UDPConn{}
			for i := 0; len(on) < 2; i++ {
				if i == 64 {
					t.Fatalf("64 sockets all reached %v", on)
				}
				c := dialUDP(t, client.NetNS, vip)
				who := mustAsk(t, c, "socket to the VIP")
				if on[who] == nil {
					on[who] = c
				}
			}
			direct := dialUDP(t, client.NetNS, netip.AddrPortFrom(podAddr(leaving, fam.vip), udpPort))
			if who := mustAsk(t, direct, "socket to the pod IP"); who != leaving.Name {
				t.Fatalf("socket to %s's IP reached %s", leaving.Name, who)
			}

			applyUDP(t, plane, vip, staying, joining)

			expectDestroyed(t, on[leaving.Name], "socket on the removed backend")
			if who, err := ask(on[staying.Name]); err != nil || who != staying.Name {
				t.Fatalf("socket on the backend that stays: %q, %v; want it untouched", who, err)
			}
			if who, err := ask(direct); err != nil || who != leaving.Name {
				t.Fatalf("socket connected to the pod IP directly: %q, %v; want it untouched", who, err)
			}
			for i := 0; i < 10; i++ {
				c := dialUDP(t, client.NetNS, vip)
				if who := mustAsk(t, c, "new socket to the VIP"); who == leaving.Name {
					t.Fatalf("new socket %d reached the removed backend %s", i, who)
				}
				c.Close()
			}
		})
	}
}

// Deleting a UDP Service destroys the sockets connected through it, so
// their owners learn at once instead of sending into the void.
func TestUDPSocketOfDeletedServiceIsDestroyed(t *testing.T) {
	f, client, plane := newSockTermFixture(t)
	vip := netip.AddrPortFrom(families[0].vip, 53)
	applyUDP(t, plane, vip, f.pods[0])
	c := dialUDP(t, client.NetNS, vip)
	mustAsk(t, c, "socket to the VIP")
	applyUDP(t, plane, vip)
	expectDestroyed(t, c, "socket of the deleted Service")
}

// A dual-stack AF_INET6 socket connected to an IPv4 Service through its
// v4-mapped address is found and destroyed too.
func TestDualStackUDPSocketOfRemovedBackendIsDestroyed(t *testing.T) {
	f, client, plane := newSockTermFixture(t)
	vip := netip.AddrPortFrom(families[0].vip, 53)
	applyUDP(t, plane, vip, f.pods[0])
	var fd int
	err := harness.Do(client.NetNS, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return err
		}
		return unix.Connect(fd, &unix.SockaddrInet6{Port: int(vip.Port()), Addr: netip.AddrFrom16(vip.Addr().As16()).As16()})
	})
	if err != nil {
		t.Fatal(err)
	}
	file := os.NewFile(uintptr(fd), "dual-stack-udp")
	pc, err := net.FilePacketConn(file)
	file.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := pc.(*net.UDPConn)
	t.Cleanup(func() { c.Close() })
	if who := mustAsk(t, c, "dual-stack socket to ::ffff:VIP"); who != f.pods[0].Name {
		t.Fatalf("dual-stack socket reached %s", who)
	}
	applyUDP(t, plane, vip, f.pods[1])
	expectDestroyed(t, c, "dual-stack socket on the removed backend")
}

// The iterator is its own object, loaded against the hooks' maps: with
// --map-size-* values its copy of those maps must be sized the same, or
// the kernel-capable node silently loses socket termination.
func TestSocketTerminationLoadsWithCustomMapSizes(t *testing.T) {
	harness.RequireRoot(t)
	if report := loader.Probe(); !report.Has(loader.FeatureUDPSockTerm) {
		t.Skipf("kernel %s cannot destroy UDP sockets (see `kpr probe`)", report.Kernel)
	}
	f := newFixture(t, 1, smallSizes)
	if f.loaded.SockTerm == nil || f.loaded.SockTermTargets == nil {
		t.Fatalf("socket-termination iterator not loaded with map sizes %+v: %+v", smallSizes, f.loaded.Features.Features)
	}
}
