package socklb

import (
	"net/netip"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// A NodePort on 127.0.0.1 or ::1 belongs to the node's own network
// namespace. In a pod's namespace loopback is the pod's: a pod listening on
// the NodePort's number must reach its own listener there, not the Service
// (under kube-proxy the pod's loopback traffic never meets its rules).
func TestLoopbackNodePortOnlyInTheHostNetns(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	const tcpNodePort, udpNodePort uint16 = 30080, 30053
	client := f.pods[2]
	if _, err := client.ServeTCP(tcpNodePort); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ServeUDP(udpNodePort); err != nil {
		t.Fatal(err)
	}
	backends := f.pods[:2]
	isBackend := func(who string) bool { return who == backends[0].Name || who == backends[1].Name }
	// Without SO_NETNS_COOKIE (before 5.14) kpr cannot tell the host
	// namespace apart and serves loopback NodePorts nowhere (see `kpr
	// probe`): the host's connect must then meet the node's own (absent)
	// listener, never a backend.
	hostServed := f.loaded.Features.Has(loader.FeatureNetnsCookieSockopt)
	unserved := func(t *testing.T, frontend netip.AddrPort) {
		t.Helper()
		if who, err := harness.WhoTCP(f.node.NetNS, frontend, timeout); err == nil {
			t.Fatalf("kernel %s lacks %q, yet connect(%s) in the host netns reached %s; want it unserved",
				f.loaded.Features.Kernel, loader.FeatureNetnsCookieSockopt, frontend, who)
		}
	}

	for _, lo := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")} {
		t.Run(lo.String(), func(t *testing.T) {
			f.service(lo, tcpNodePort, dataplane.TCP, backends...)
			f.service(lo, udpNodePort, dataplane.UDP, backends...)
			tcpFrontend := netip.AddrPortFrom(lo, tcpNodePort)
			udpFrontend := netip.AddrPortFrom(lo, udpNodePort)

			for i := 0; i < 10; i++ {
				who, err := harness.WhoTCP(client.NetNS, tcpFrontend, timeout)
				if err != nil {
					t.Fatalf("pod: %v", err)
				}
				if who != client.Name {
					t.Fatalf("in pod %s, connect(%s) reached %s, want the pod's own listener", client.Name, tcpFrontend, who)
				}
				who, from, err := harness.WhoUDP(client.NetNS, udpFrontend, timeout)
				if err != nil {
					t.Fatalf("pod: %v", err)
				}
				if who != client.Name || from != udpFrontend {
					t.Fatalf("in pod %s, sendto(%s) was answered by %s from %s, want the pod's own server", client.Name, udpFrontend, who, from)
				}
			}

			if !hostServed {
				unserved(t, tcpFrontend)
				return
			}
			for i := 0; i < 10; i++ {
				who, err := harness.WhoTCP(f.node.NetNS, tcpFrontend, timeout)
				if err != nil {
					t.Fatalf("host: %v", err)
				}
				if !isBackend(who) {
					t.Fatalf("in the host netns, connect(%s) reached %s, want a backend of the NodePort", tcpFrontend, who)
				}
				who, from, err := harness.WhoUDP(f.node.NetNS, udpFrontend, timeout)
				if err != nil {
					t.Fatalf("host: %v", err)
				}
				if !isBackend(who) || from != udpFrontend {
					t.Fatalf("in the host netns, sendto(%s) was answered by %s from %s, want a backend, from the frontend", udpFrontend, who, from)
				}
			}
		})
	}

	// A restart swaps new programs into the pinned links; they learn the
	// host namespace again, so the rule holds across it.
	f.load(loader.MapSizes{})
	lo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), tcpNodePort)
	if who, err := harness.WhoTCP(client.NetNS, lo, timeout); err != nil || who != client.Name {
		t.Fatalf("after the program swap, pod to %s: %q, %v; want its own listener", lo, who, err)
	}
	if !hostServed {
		unserved(t, lo)
	} else if who, err := harness.WhoTCP(f.node.NetNS, lo, timeout); err != nil || !isBackend(who) {
		t.Fatalf("after the program swap, host to %s: %q, %v; want a backend", lo, who, err)
	}

	// Only loopback is tied to the host: pods still reach other frontends.
	vip := netip.AddrPortFrom(families[0].vip, 80)
	f.service(vip.Addr(), vip.Port(), dataplane.TCP, backends...)
	if who, err := harness.WhoTCP(client.NetNS, vip, timeout); err != nil || !isBackend(who) {
		t.Fatalf("pod to ClusterIP %s: %q, %v; want a backend", vip, who, err)
	}
}
