package socketlb

import (
	"errors"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/tests/harness"
)

// The node's end of a pod's veth is found from inside the pod, on a
// bridge CNI (a port of the bridge) and on a routed one (no bridge); a
// veth whose other end is in a third namespace is not the node's.
func TestNodeDevicesFindsThePodsVethOnBridgeAndRoutedCNIs(t *testing.T) {
	harness.RequireRoot(t)
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bridged, err := node.AddPod("bridged")
	if err != nil {
		t.Fatal(err)
	}
	routed, err := node.AddRoutedPod("routed")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*harness.Pod{bridged, routed} {
		got, err := nodeDevices(p.NetNS.Path, node.NetNS.Path)
		if err != nil || !slices.Equal(got, []string{p.HostVeth}) {
			t.Errorf("node devices of pod %s = %v, %v; want [%s]", p.Name, got, err, p.HostVeth)
		}
	}
	// A second interface of the bridged pod, whose other end is in the
	// routed pod's namespace: an index there may name any link of the
	// node's, which must not be taken for the pod's.
	extra := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "side0"}, PeerName: "side1",
		PeerNamespace: netlink.NsFd(int(routed.NetNS.Handle()))}
	if err := bridged.NetNS.Netlink().LinkAdd(extra); err != nil {
		t.Fatal(err)
	}
	if got, err := nodeDevices(bridged.NetNS.Path, node.NetNS.Path); err != nil || !slices.Equal(got, []string{bridged.HostVeth}) {
		t.Errorf("node devices of pod bridged with a veth to another pod = %v, %v; want only [%s]", got, err, bridged.HostVeth)
	}
	// A namespace with no veth to the node.
	lone, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeDevices(lone.NetNS.Path, node.NetNS.Path); !errors.Is(err, ErrNoNodeDevice) {
		t.Errorf("node devices of a namespace without a veth to the node: %v, want ErrNoNodeDevice", err)
	}
}
