package iptables

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/harness"
)

// A ClusterIP that keeps gaining its first endpoint and losing its last,
// while the node connects to it: every connect is served or refused,
// none leaves untranslated. The filter table (the REJECT of a Service
// without endpoints) and the nat table (its DNAT) are committed by
// separate restores; written filter first, as kube-proxy writes them, a
// Service gaining its first endpoint had neither between the two, and
// its connects went to the Service range, which leads nowhere here (no
// route to host, or a timeout).
func TestEndpointFlipsLeaveNoConnectUntranslated(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) { endpointFlipsLeaveNoConnectUntranslated(t, v) })
	}
}

func endpointFlipsLeaveNoConnectUntranslated(t *testing.T, v netfilter.Variant) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []*harness.Pod
	for _, name := range []string{"a", "b"} {
		p, err := node.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeTCP(8080); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	// The Service range is routed to the bridge, where no one answers
	// for it: an untranslated connect fails there instead of being
	// refused for want of a route before nat OUTPUT sees it.
	serviceRange := &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(12, 32)}
	if err := node.NetNS.Netlink().RouteAdd(&netlink.Route{Dst: serviceRange, LinkIndex: node.BridgeIndex}); err != nil {
		t.Fatal(err)
	}
	plane, err := New(Options{
		Runner:   netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", node.NetNS.Name}},
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4)},
		Log:      zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}

	vip := netip.MustParseAddrPort("10.96.0.1:80")
	web := func(pods ...*harness.Pod) *dataplane.ServicePort {
		var bs []dataplane.Backend
		for _, p := range pods {
			bs = append(bs, dataplane.Backend{Addr: p.IPv4, Port: 8080})
		}
		return &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, vip.String(), dataplane.TCP, bs, nil)}}
	}
	// Every other write leaves the Service without endpoints; the others
	// give it one or two.
	states := []*dataplane.ServicePort{web(), web(pods[0]), web(), web(pods[0], pods[1])}
	if err := plane.Reconcile(changes(states[0])); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	done := make(chan struct{})
	var writes atomic.Int64
	const minWrites = 100
	window := harness.ChurnWindow{Min: 10 * time.Second, Max: 90 * time.Second}
	window.Start()
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if err := plane.Apply(changes(states[(writes.Load()+1)%int64(len(states))])); err != nil {
				t.Errorf("write %d: %v", writes.Load(), err)
				return
			}
			writes.Add(1)
		}
	}()

	connects, served, refused := 0, 0, 0
	failed := map[string]int{}
	for ; window.Open(writes.Load() >= minWrites); connects++ {
		who, err := harness.WhoTCP(node.NetNS, vip, packetTimeout)
		switch {
		case err == nil && (who == pods[0].Name || who == pods[1].Name):
			served++
		case errors.Is(err, syscall.ECONNREFUSED):
			refused++
		case err != nil:
			failed[err.Error()]++
		default:
			failed["answered by "+who]++
		}
	}
	close(stop)
	<-done
	t.Logf("%d connects (%d served, %d refused) during %d writes", connects, served, refused, writes.Load())
	if writes.Load() < minWrites || served == 0 || refused == 0 {
		t.Fatalf("%d writes in %v, %d connects served and %d refused: the test needs many flips, with connects seeing both states",
			writes.Load(), window.Max, served, refused)
	}
	for err, count := range failed {
		t.Errorf("%d of %d connects neither served nor refused: %s", count, connects, err)
	}
}
