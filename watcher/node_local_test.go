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
