package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// badInputSyncPeriod is short so that full reconciles, which rebuild
// kpr's view of who owns each frontend, happen while the scenarios run.
const badInputSyncPeriod = 3 * time.Second

// TestBadInput feeds kpr objects that are wrong in the ways the API lets
// through. kpr must keep running and healthy, log what it ignores, and keep
// serving the usable rest.
func TestBadInput(t *testing.T) {
	f := newFixture(t, "--sync-period", badInputSyncPeriod.String())
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, f *fixture, ns string)
	}{
		{"invalid-address", testInvalidAddress},
		{"invalid-port", testInvalidPort},
		{"thousand-endpoints", testThousandEndpoints},
		{"duplicate-endpoint", testDuplicateEndpoint},
		{"externalip-conflict", testExternalIPConflict},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sc.run(t, f, f.namespace(t, sc.name))
			f.requireRunning(t)
			if code, err := f.healthz(); err != nil || code != 200 {
				t.Errorf("/healthz after %s = %d, %v; want 200", sc.name, code, err)
			}
		})
	}
}

// testInvalidAddress: the API server refuses malformed endpoint addresses
// outright, so they cannot reach (or hurt) kpr; the test checks that this
// is still so. What does get through is an FQDN slice labelled for the
// Service, which kpr must skip, next to a usable slice.
func testInvalidAddress(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "addr", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)

	for i, bad := range []string{"300.1.1.1", "10.1.1", "0.0.0.0", "127.0.0.1", "fd00::1", "10.1.1.1/32"} {
		s := kubeobj.Slice(svc, fmt.Sprintf("addr-bad-%d", i), v4)
		s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{bad}}}
		if err := f.client.ApplySlice(f.ctx, s); err == nil {
			t.Errorf("the API server accepted endpoint address %q in an IPv4 slice: kpr now has to cope with it, extend this test", bad)
		}
	}
	fqdn := kubeobj.Slice(svc, "addr-fqdn", discoveryv1.AddressTypeFQDN)
	fqdn.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"backend.example.com"}}}
	f.applySlice(t, fqdn)

	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
	// A later change to the same Service still goes through.
	f.setEndpoints(t, svc, v4, f.eps("pod-c")...)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-c")
}

// testInvalidPort: the API stores slice ports of 0, -1 and 70000 and
// ports without a number. kpr ignores those ports (and so the endpoints
// reachable only through them), says so in its log, and serves the
// endpoints of the valid slice.
func testInvalidPort(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "port", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	for i, port := range []*int32{ptr.To(int32(0)), ptr.To(int32(-1)), ptr.To(int32(70000)), nil} {
		s := kubeobj.Slice(svc, fmt.Sprintf("port-bad-%d", i), v4, f.eps("pod-b", "pod-c")...)
		s.Ports[0].Port = port
		f.applySlice(t, s)
	}
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a")
	for _, s := range frontendsOf(f.dump(t), vip.Addr()) {
		if len(s.Backends) != 1 {
			t.Errorf("kpr dump: %s has backends %v, want only pod-a's", s.Frontend, s.Backends)
		}
	}
	waitUntil(t, convergeTimeout, "kpr logs the ignored ports", func() error {
		log := f.kpr.Log()
		for _, want := range []string{"port-bad-0", "port-bad-3", "out of range"} {
			if !strings.Contains(log, want) {
				return fmt.Errorf("log does not mention %q", want)
			}
		}
		return nil
	})
}

// testThousandEndpoints: a slice with 1000 endpoints (the API's maximum
// per slice). They all live in pod-d: its namespace treats 10.250.0.0/22
// as local (AnyIP) and the node routes that range to it, so every one of
// them answers.
func testThousandEndpoints(t *testing.T, f *fixture, ns string) {
	const n = 1000
	many := netip.MustParsePrefix("10.250.0.0/22")
	host := f.pod("pod-d")
	lo, err := host.NetNS.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := host.NetNS.Netlink().RouteAdd(&netlink.Route{
		LinkIndex: lo.Attrs().Index, Dst: ipNet(many), Type: unix.RTN_LOCAL,
		Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST,
	}); err != nil {
		t.Fatalf("AnyIP route for %s in %s: %v", many, host.NetNS.Name, err)
	}
	if err := f.node.NetNS.Netlink().RouteAdd(&netlink.Route{
		LinkIndex: f.node.BridgeIndex, Dst: ipNet(many), Gw: host.IPv4.AsSlice(),
	}); err != nil {
		t.Fatalf("route %s via %s in the node: %v", many, host.Name, err)
	}

	svc := f.createService(t, kubeobj.Service(ns, "big", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	eps := make([]kubeobj.Endpoint, 0, n)
	addr := many.Addr()
	for range n {
		addr = addr.Next()
		eps = append(eps, kubeobj.Endpoint{Addr: addr})
	}
	f.setEndpoints(t, svc, v4, eps...)
	waitUntil(t, convergeTimeout, "kpr dump shows 1000 backends", func() error {
		d := frontendsOf(f.dump(t), vip.Addr())
		if len(d) != 1 || len(d[0].Backends) != n {
			return fmt.Errorf("dump of %s: %d entries, backends %d", vip.Addr(), len(d), backendsCount(d))
		}
		return nil
	})
	// Every endpoint answers (as pod-d), so every connect must succeed
	// whichever of the 1000 it was given.
	seen, err := sample(tcpWho, f.node.NetNS, vip, 200)
	if err != nil || len(seen) != 1 || seen["pod-d"] != 200 {
		t.Fatalf("200 connects to a Service with 1000 endpoints: answered by %v, %v; want pod-d every time", seen, err)
	}

	// And back down to two ordinary pods.
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
}

// testDuplicateEndpoint: one endpoint in two slices with different
// conditions, as while a pod moves between slices. kpr uses it when
// either copy is ready (a ready copy wins, in whichever slice it is), and
// the Service's other endpoints are unaffected.
func testDuplicateEndpoint(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "dup", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	notReady := conditions(false, false, false)

	f.applySlice(t, kubeobj.Slice(svc, "dup-1", v4, f.ep("pod-a", v4)))
	f.applySlice(t, kubeobj.Slice(svc, "dup-2", v4, f.ep("pod-a", v4, notReady), f.ep("pod-b", v4)))
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")

	f.applySlice(t, kubeobj.Slice(svc, "dup-1", v4, f.ep("pod-a", v4, notReady), f.ep("pod-c", v4)))
	f.applySlice(t, kubeobj.Slice(svc, "dup-2", v4, f.ep("pod-a", v4), f.ep("pod-b", v4)))
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b", "pod-c")

	// Not ready in both: gone; the others stay.
	f.applySlice(t, kubeobj.Slice(svc, "dup-2", v4, f.ep("pod-a", v4, notReady), f.ep("pod-b", v4)))
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-b", "pod-c")
	for _, s := range frontendsOf(f.dump(t), vip.Addr()) {
		if len(s.Backends) != 2 {
			t.Errorf("kpr dump: %s has backends %v, want pod-b and pod-c once each", s.Frontend, s.Backends)
		}
	}
}

// testExternalIPConflict: a Service claims another Service's ClusterIP:port
// as an external IP. The ClusterIP keeps going to its own Service, across
// full reconciles too, kpr says what is wrong, and the conflict neither
// slows down other changes nor makes kpr unhealthy.
func testExternalIPConflict(t *testing.T, f *fixture, ns string) {
	// Names chosen so that the intruder sorts first.
	owner := f.createService(t, kubeobj.Service(ns, "z-owner", tcp80))
	vip := clusterIP(t, owner, v1.IPv4Protocol, 80)
	f.setEndpoints(t, owner, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")

	intruder := kubeobj.Service(ns, "a-intruder", tcp80)
	intruder.Spec.ExternalIPs = []string{vip.Addr().String()}
	intruder = f.createService(t, intruder)
	f.setEndpoints(t, intruder, v4, f.eps("pod-c")...)
	waitServes(t, tcpWho, f.node.NetNS, clusterIP(t, intruder, v1.IPv4Protocol, 80), "pod-c")

	waitUntil(t, convergeTimeout, "kpr logs the conflict", func() error {
		for _, line := range strings.Split(f.kpr.Log(), "\n") {
			if strings.Contains(line, "a-intruder") && strings.Contains(line, vip.String()) {
				return nil
			}
		}
		return fmt.Errorf("no log line names a-intruder and %s", vip)
	})

	// Over several full reconciles the ClusterIP stays with its owner,
	// and an unrelated change is applied as fast as without the conflict.
	other := f.createService(t, kubeobj.Service(ns, "bystander", tcp80))
	otherVIP := clusterIP(t, other, v1.IPv4Protocol, 80)
	end := time.Now().Add(3*badInputSyncPeriod + time.Second)
	backends := []string{"pod-a", "pod-b", "pod-c", "pod-d"}
	for i := 0; time.Now().Before(end); i++ {
		requireServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
		pod := backends[i%len(backends)]
		f.setEndpoints(t, other, v4, f.eps(pod)...)
		written := time.Now()
		waitUntil(t, convergeTimeout, "bystander follows its slice", func() error {
			who, err := tcpWho(f.node.NetNS, otherVIP)
			if err == nil && who != pod {
				err = fmt.Errorf("answered by %s, want %s", who, pod)
			}
			return err
		})
		if took := time.Since(written); took > 2*time.Second {
			t.Errorf("change %d of an unrelated Service took %s to apply while the conflict exists, want < 2s", i, took)
		}
	}
	if code, err := f.healthz(); err != nil || code != 200 {
		t.Errorf("/healthz = %d, %v with the conflict in place for %s; want 200: a user's bad Service must not fail the node's proxy",
			code, err, 3*badInputSyncPeriod)
	}

	// The other way round: the external IP is there first, then the API
	// allocates it as a ClusterIP. The ClusterIP's Service takes it over.
	free := netip.MustParseAddr("10.96.250.250")
	f.updateService(t, intruder, func(s *v1.Service) { s.Spec.ExternalIPs = []string{free.String()} })
	freeVIP := netip.AddrPortFrom(free, 80)
	waitServes(t, tcpWho, f.node.NetNS, freeVIP, "pod-c")
	// The old ClusterIP is its owner's alone again.
	requireServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
	late := kubeobj.Service(ns, "late-owner", tcp80)
	late.Spec.ClusterIP = free.String()
	late = f.createService(t, late)
	f.setEndpoints(t, late, v4, f.eps("pod-d")...)
	waitServes(t, tcpWho, f.node.NetNS, freeVIP, "pod-d")

	// Once the intruder is gone, deleting the owner leaves nothing behind.
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "a-intruder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "late-owner", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, convergeTimeout, "the deleted Services' frontends leave the maps", func() error {
		if d := frontendsOf(f.dump(t), free); len(d) > 0 {
			return fmt.Errorf("still in kpr dump: %+v", d)
		}
		return nil
	})
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func backendsCount(d []kprproc.DumpService) int {
	n := 0
	for _, s := range d {
		n += len(s.Backends)
	}
	return n
}
