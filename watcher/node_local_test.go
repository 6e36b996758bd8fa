package watcher

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/desired"
)

// A new local address changes the node facts, and so recomputes every
// Service; the same addresses again change nothing. The Node object's
// addresses stay.
func TestNodeTrackerLocalAddresses(t *testing.T) {
	n := newNodeTracker("node-a", desired.NodeConfig{}, nil)
	n.update(testNode("z1", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"}))
	added := netip.MustParseAddr("192.0.2.11")
	if !n.setLocal([]netip.Addr{added}) {
		t.Fatal("a new local address reported no change")
	}
	if n.setLocal([]netip.Addr{added}) {
		t.Error("the same local addresses again reported a change")
	}
	got := n.current().Addresses
	if !slices.Contains(got, added) || !slices.Contains(got, netip.MustParseAddr("192.0.2.10")) {
		t.Errorf("addresses %v, want the Node's 192.0.2.10 and the local %s", got, added)
	}
	// A Node update keeps the local addresses.
	n.update(testNode("z2", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"}))
	if !slices.Contains(n.current().Addresses, added) {
		t.Errorf("after a Node update, addresses %v lost the local %s", n.current().Addresses, added)
	}
}

// Config.NodeIPs hears of the Node's InternalIP and ExternalIP addresses
// when they first arrive and when they change, not at every status
// heartbeat.
func TestNodeTrackerReportsNodeIPs(t *testing.T) {
	n := newNodeTracker("node-a", desired.NodeConfig{}, nil)
	var got [][]netip.Addr
	n.onNodeIPs = func(ips []netip.Addr) { got = append(got, ips) }
	n.update(testNode("z1", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"}))
	n.update(testNode("z2", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"}))
	n.update(testNode("z2", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"},
		v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.7"}))
	want := [][]netip.Addr{{netip.MustParseAddr("192.0.2.10")},
		{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("203.0.113.7")}}
	if !slices.EqualFunc(got, want, func(a, b []netip.Addr) bool { return slices.Equal(a, b) }) {
		t.Errorf("NodeIPs calls %v, want %v", got, want)
	}
}
