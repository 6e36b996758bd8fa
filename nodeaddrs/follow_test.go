package nodeaddrs

import (
	"testing"

	"golang.org/x/sys/unix"
)

// A node that cannot load modules on demand (no modprobe, as in the real
// test cluster's VMs, or modules_disabled) has no NETLINK_XFRM without
// xfrm_user, and kpr exited there: "open netlink in network namespace:
// protocol not supported". The follower needs routing netlink only.
func TestFollowerOpensRoutingNetlinkOnly(t *testing.T) {
	f, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.h.SupportsNetlinkFamily(unix.NETLINK_ROUTE) {
		t.Error("the follower has no routing netlink socket")
	}
	for _, family := range []int{unix.NETLINK_XFRM, unix.NETLINK_NETFILTER} {
		if f.h.SupportsNetlinkFamily(family) {
			t.Errorf("the follower opened netlink family %d, which it does not use and the node may lack", family)
		}
	}
}
