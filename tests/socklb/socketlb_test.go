package socklb

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/harness"
)

// A pod the socket hooks do not serve keeps the Service address in its
// connect() and sendmsg(). To see that from inside the pod without waiting
// for an untranslated packet to die, the client pod holds the VIPs on its
// loopback and serves the Service port itself: an untranslated connection
// reaches the client's own server, a translated one the backend.

// clientHoldingVIPs adds a pod that serves TCP and UDP on the backends'
// ports and holds every family's VIP on its loopback.
func clientHoldingVIPs(t *testing.T, f *fixture) *harness.Pod {
	t.Helper()
	client, err := f.node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.ServeTCP(tcpPort); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ServeUDP(udpPort); err != nil {
		t.Fatal(err)
	}
	nl := client.NetNS.Netlink()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		bits := 32
		if fam.vip.Is6() {
			bits = 128
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: fam.vip.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
		if err := nl.AddrAdd(lo, addr); err != nil {
			t.Fatalf("add %s to the client's loopback: %v", fam.vip, err)
		}
	}
	return client
}

// whoAnswers asks every family's VIP over TCP and UDP from ns, and fails
// unless want answered each.
func whoAnswers(t *testing.T, ns *harness.NetNS, want string) {
	t.Helper()
	for _, fam := range families {
		tcp, udp := netip.AddrPortFrom(fam.vip, tcpPort), netip.AddrPortFrom(fam.vip, udpPort)
		if who, err := harness.WhoTCP(ns, tcp, timeout); err != nil || who != want {
			t.Errorf("TCP %s from %s: answered by %q (%v), want %s", tcp, ns.Name, who, err, want)
		}
		if who, _, err := harness.WhoUDP(ns, udp, timeout); err != nil || who != want {
			t.Errorf("UDP %s from %s: answered by %q (%v), want %s", udp, ns.Name, who, err, want)
		}
	}
}

func (f *fixture) vipServices(t *testing.T) {
	t.Helper()
	for _, fam := range families {
		f.service(fam.vip, tcpPort, dataplane.TCP, f.pods[0])
		f.service(fam.vip, udpPort, dataplane.UDP, f.pods[0])
	}
}

// requireNetNSCookies skips a test of the modes that tell pods apart by
// their network namespace on a kernel without SO_NETNS_COOKIE, after
// checking that the loader falls back as it says: per-pod to all, with a
// warning, host-only to an error.
func requireNetNSCookies(t *testing.T) {
	t.Helper()
	report := loader.Probe()
	if report.Has(loader.FeatureNetnsCookieSockopt) {
		return
	}
	f := newSocketLBFixture(t, 1, loader.MapSizes{}, loader.SocketLBPerPod)
	if f.loaded.SocketLB != loader.SocketLBAll {
		t.Fatalf("kernel %s lacks SO_NETNS_COOKIE, yet --socket-lb per-pod loaded as %s; want the fallback to all", report.Kernel, f.loaded.SocketLB)
	}
	t.Skipf("kernel %s lacks SO_NETNS_COOKIE (Linux 5.14+): per-pod falls back to all (checked), host-only is refused", report.Kernel)
}

func TestPerPodBypassLeavesTheServiceAddress(t *testing.T) {
	requireNetNSCookies(t)
	f := newSocketLBFixture(t, 1, loader.MapSizes{}, loader.SocketLBPerPod)
	f.vipServices(t)
	client := clientHoldingVIPs(t, f)
	backend := f.pods[0].Name

	whoAnswers(t, client.NetNS, backend) // served until listed

	cookie, err := loader.NetNSCookie(client.NetNS.Path)
	if err != nil {
		t.Fatal(err)
	}
	bypass := maps.NewSockBypass(f.loaded.Maps.KprSockBypass)
	if err := bypass.Set(cookie, maps.SockBypassMesh); err != nil {
		t.Fatal(err)
	}
	whoAnswers(t, client.NetNS, client.Name)
	whoAnswers(t, f.node.NetNS, backend) // the node is not the pod

	counts := map[string]metrics.SockHookCounts{}
	if err := ebpfplane.SockCounts(f.loaded.Maps.KprSockStats)(func(h metrics.SockHookCounts) { counts[h.Hook] = h }); err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"connect4", "connect6", "sendmsg4", "sendmsg6"} {
		if counts[hook].Bypassed == 0 {
			t.Errorf("%s counted no bypassed frontend: %+v", hook, counts[hook])
		}
	}

	if err := bypass.Delete(cookie); err != nil {
		t.Fatal(err)
	}
	whoAnswers(t, client.NetNS, backend)
}

func TestHostOnlyServesOnlyTheNode(t *testing.T) {
	requireNetNSCookies(t)
	f := newSocketLBFixture(t, 1, loader.MapSizes{}, loader.SocketLBHostOnly)
	f.vipServices(t)
	client := clientHoldingVIPs(t, f)
	whoAnswers(t, client.NetNS, client.Name)
	whoAnswers(t, f.node.NetNS, f.pods[0].Name)
}

// The modes' flag values round-trip, and a wrong one names the right ones.
func TestParseSocketLBMode(t *testing.T) {
	for _, name := range loader.SocketLBModes {
		m, err := loader.ParseSocketLBMode(name)
		if err != nil || m.String() != name {
			t.Errorf("ParseSocketLBMode(%q) = %v, %v", name, m, err)
		}
	}
	if _, err := loader.ParseSocketLBMode("pods"); err == nil {
		t.Error("ParseSocketLBMode(pods) succeeded")
	}
}
