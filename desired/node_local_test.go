package desired

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The addresses on the node's own devices serve NodePorts as the Node
// object's do, under the same --nodeport-addresses filter; "primary" stays
// the Node object's primary IPs.
func TestSelectLocalAddresses(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.10"}}}}
	local := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("198.51.100.5")}
	for _, tc := range []struct {
		flags []string
		want  []string
	}{
		{nil, []string{"127.0.0.1", "192.0.2.10", "192.0.2.11", "198.51.100.5", "::1"}},
		{[]string{"192.0.2.0/24"}, []string{"192.0.2.10", "192.0.2.11"}},
		{[]string{"primary"}, []string{"192.0.2.10"}},
	} {
		npa, err := ParseNodePortAddresses(tc.flags)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range npa.Select(node, local...) {
			got = append(got, a.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("--nodeport-addresses %v: Select = %v, want %v", tc.flags, got, tc.want)
		}
	}
	// Before the Node object is seen, the local addresses already serve.
	n := NewNode("n", nil, NodeConfig{}, local[1])
	if !slices.Contains(n.Addresses, local[1]) || len(n.IPs) != 0 {
		t.Errorf("NewNode without the Node object = %+v, want %s among Addresses and no IPs (ExternalIPsNodeLocal stays the Node's)", n, local[1])
	}
}
