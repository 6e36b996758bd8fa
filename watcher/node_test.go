package watcher

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/desired"
)

func testNode(zone string, addrs ...v1.NodeAddress) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: zone}},
		Status:     v1.NodeStatus{Addresses: addrs},
	}
}

func TestNodeInfo(t *testing.T) {
	node := testNode("z1",
		v1.NodeAddress{Type: v1.NodeHostName, Address: "node-a"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "2001:db8::10"},
		v1.NodeAddress{Type: v1.NodeExternalIP, Address: "198.51.100.7"},
		v1.NodeAddress{Type: v1.NodeExternalIP, Address: "192.0.2.10"}, // listed twice
		v1.NodeAddress{Type: v1.NodeInternalDNS, Address: "node-a.example"},
	)
	for _, tc := range []struct {
		name     string
		prefixes []string
		want     []string
	}{
		{"no filter", nil, []string{"127.0.0.1", "192.0.2.10", "198.51.100.7", "::1", "2001:db8::10"}},
		{"IPv4 subnet", []string{"192.0.2.0/24"}, []string{"192.0.2.10"}},
		{"both families", []string{"198.51.100.0/24", "2001:db8::/64"}, []string{"198.51.100.7", "2001:db8::10"}},
		{"nothing matches", []string{"203.0.113.0/24"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			npa, err := desired.ParseNodePortAddresses(tc.prefixes)
			if err != nil {
				t.Fatal(err)
			}
			n := newNodeTracker("node-a", desired.NodeConfig{NodePortAddresses: npa}, nil)
			n.update(node)
			info := n.current()
			var got []string
			for _, a := range info.Addresses {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) || info.Zone != "z1" || info.Name != "node-a" {
				t.Errorf("node facts = %+v, want zone z1 and addresses %v", info, tc.want)
			}
		})
	}
}

func TestNodeTrackerReportsOnlyRelevantChanges(t *testing.T) {
	n := newNodeTracker("node-a", desired.NodeConfig{}, nil)
	if n.known() || n.current().Name != "node-a" {
		t.Fatalf("fresh tracker: known=%v current=%+v", n.known(), n.current())
	}
	node := testNode("z1", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"})
	if !n.update(node) {
		t.Error("first sight of the Node did not count as a change")
	}
	heartbeat := node.DeepCopy()
	heartbeat.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	if n.update(heartbeat) {
		t.Error("a status heartbeat counted as a change")
	}
	if !n.update(testNode("z2", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.10"})) {
		t.Error("a zone change did not count")
	}
	if !n.update(testNode("z2", v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.11"})) {
		t.Error("an address change did not count")
	}
	n.deleted()
	if got := n.current(); got.Zone != "z2" || !slices.Contains(got.Addresses, netip.MustParseAddr("192.0.2.11")) {
		t.Errorf("after deletion the node facts are %+v, want the last known ones kept", got)
	}
}
