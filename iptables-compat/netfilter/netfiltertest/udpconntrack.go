package netfiltertest

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/tests/harness"
)

// PlaneIn returns a new Plane programming the namespace of node, as a kpr
// that has just started there would: nothing but the kernel's state
// carries over from an earlier one.
type PlaneIn func(t *testing.T, node *harness.Node) dataplane.Dataplane

// The DNS Service of the UDP conntrack scenarios, and how long a resolver
// may go unanswered after its endpoints changed.
var (
	dnsVIP  = netip.MustParseAddrPort("10.96.0.10:53")
	dnsName = dataplane.ServicePortName{Namespace: "kube-system", Name: "dns", Protocol: dataplane.UDP}
)

const (
	udpServerPort = 8080
	answerWithin  = 2 * time.Second
)

// CheckUDPConntrack runs the UDP conntrack scenarios with real packets
// against Planes made by newPlane: a resolver that keeps one source port
// must be answered by a current endpoint soon after every change, however
// its earlier datagrams went, and across a restart. Each scenario needs
// root.
func CheckUDPConntrack(t *testing.T, newPlane PlaneIn) {
	t.Run("server-cycling", func(t *testing.T) { serverCycling(t, newPlane) })
	t.Run("restart", func(t *testing.T) { restartAfterRemoval(t, newPlane) })
	t.Run("restart-service-deleted", func(t *testing.T) { restartAfterServiceDeleted(t, newPlane) })
}

// serverCycling: the resolver's first datagram goes out before the
// Service has a rule (kpr not yet synced it; in the field also a moment
// between two table writes). Its conntrack entry records no translation,
// and every later datagram of the flow follows that entry instead of the
// rules, so without a deletion the resolver is never answered. Then the
// server pods cycle, through a moment with no endpoint, as a replaced
// single DNS pod does.
func serverCycling(t *testing.T, newPlane PlaneIn) {
	node, pods := udpNode(t, "a", "b")
	a, b := pods[0], pods[1]
	plane := newPlane(t, node)
	if err := plane.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	conn, err := harness.DialUDP(node.NetNS, dnsVIP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if who, err := harness.AskUDP(conn, 200*time.Millisecond); err == nil {
		t.Fatalf("%s answered %s before any rule served it", dnsVIP, who)
	}

	steps := []struct {
		pods []*harness.Pod
		want *harness.Pod // nil: no endpoint, nothing to expect
	}{
		{nil, nil},
		{[]*harness.Pod{a}, a},
		{[]*harness.Pod{a, b}, nil},
		{[]*harness.Pod{b}, b},
		{nil, nil},
		{[]*harness.Pod{a}, a},
	}
	for i, s := range steps {
		if err := plane.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{dnsName: dnsPort(s.pods...)}); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if s.want != nil {
			requireAnswer(t, conn, s.want, "step %d: endpoints %s", i, names(s.pods))
		} else {
			_, _ = harness.AskUDP(conn, 100*time.Millisecond) // the flow keeps going, as a resolver's does
		}
	}
}

// restartAfterRemoval: the resolver's flow goes to a; kpr stops, a stops
// being an endpoint (its pod still answers, as a terminating one can),
// and the new kpr's first sync must delete the entry no diff of its own
// could tell it about.
func restartAfterRemoval(t *testing.T, newPlane PlaneIn) {
	node, pods := udpNode(t, "a", "b")
	a, b := pods[0], pods[1]
	before := newPlane(t, node)
	if err := before.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{dnsName: dnsPort(a)}); err != nil {
		t.Fatal(err)
	}
	conn, err := harness.DialUDP(node.NetNS, dnsVIP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	requireAnswer(t, conn, a, "before the restart")

	after := newPlane(t, node)
	if err := after.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{dnsName: dnsPort(b)}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if who, err := harness.AskUDP(conn, answerWithin); err != nil || who != b.Name {
			t.Fatalf("query %d after the restart was answered by %q (%v), want %s: the removed backend's conntrack entry is still there",
				i, who, err, b.Name)
		}
	}
}

// restartAfterServiceDeleted: the resolver's flow goes to a; kpr stops
// and the whole Service is deleted. The new kpr has never heard of it:
// only the kernel's rules, read at its first sync, name the frontend
// whose entries still lead to a.
func restartAfterServiceDeleted(t *testing.T, newPlane PlaneIn) {
	node, pods := udpNode(t, "a")
	a := pods[0]
	before := newPlane(t, node)
	if err := before.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{dnsName: dnsPort(a)}); err != nil {
		t.Fatal(err)
	}
	conn, err := harness.DialUDP(node.NetNS, dnsVIP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	requireAnswer(t, conn, a, "before the restart")

	after := newPlane(t, node)
	if err := after.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if who, err := harness.AskUDP(conn, 300*time.Millisecond); err == nil {
			t.Fatalf("query %d after the restart was answered by %s, though its Service is gone: its conntrack entry is still there", i, who)
		}
	}
}

// requireAnswer asks on conn every 50 ms until want answers, and fails t
// if that takes longer than answerWithin or another pod answers.
func requireAnswer(t *testing.T, conn *net.UDPConn, want *harness.Pod, format string, args ...any) {
	t.Helper()
	start := time.Now()
	var last error
	for time.Since(start) < answerWithin {
		who, err := harness.AskUDP(conn, 50*time.Millisecond)
		switch {
		case err == nil && who == want.Name:
			return
		case err == nil:
			t.Fatalf(format+": answered by %s, want %s", append(args, who, want.Name)...)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf(format+": %s did not answer within %s: %v", append(args, want.Name, answerWithin, last)...)
}

// udpNode is a node namespace with pods serving UDP on udpServerPort and
// a route to the Service range: a socket on the node looks a route up
// before nat OUTPUT rewrites the destination, and a real node has its
// default route.
func udpNode(t *testing.T, names ...string) (*harness.Node, []*harness.Pod) {
	harness.RequireRoot(t)
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []*harness.Pod
	for _, name := range names {
		p, err := node.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeUDP(udpServerPort); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	serviceRange := &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(12, 32)}
	if err := node.NetNS.Netlink().RouteAdd(&netlink.Route{Dst: serviceRange, LinkIndex: node.BridgeIndex}); err != nil {
		t.Fatal(err)
	}
	return node, pods
}

func dnsPort(pods ...*harness.Pod) *dataplane.ServicePort {
	var bs []dataplane.Backend
	for _, p := range pods {
		bs = append(bs, dataplane.Backend{Addr: p.IPv4, Port: udpServerPort})
	}
	return &dataplane.ServicePort{Name: dnsName, Frontends: []dataplane.Frontend{{
		Addr: dnsVIP.Addr(), Port: dnsVIP.Port(), Protocol: dataplane.UDP, Kind: dataplane.ClusterIP, Backends: bs}}}
}

func names(pods []*harness.Pod) []string {
	out := []string{}
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
