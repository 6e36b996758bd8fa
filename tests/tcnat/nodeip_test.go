package tcnat

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// `kpr run` without --devices on a node whose uplink is a veth and that has
// no default route: the veth carries the Node object's InternalIP, so it is
// the node's device, and gets the tc programs once kpr has read the Node; a
// NodePort then answers from outside. A tun device with an address beside
// it gets none, and the daemon's status names it.
func TestKprRunAttachesToTheDeviceWithTheNodeIP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName = "kpr-tcnat-nodeip"
	// The Node's InternalIP is nodeAddrs[0], on ext0.
	cl, api := testCluster(ctx, t, nodeName)
	top := buildTopology(t, 1)
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := top.node.NetNS.Netlink().RouteList(nil, family)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				t.Fatalf("the node namespace has a default route (%v); this test needs none", r)
			}
		}
	}
	tun := openTun(t, top.node.NetNS, "tun0")
	if err := top.node.NetNS.Netlink().AddrAdd(tun, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.9"), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := top.node.NetNS.Netlink().LinkSetUp(tun); err != nil {
		t.Fatal(err)
	}
	kpr := runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--tc-attach", "auto")

	if !eventually(10*time.Second, func() bool { return !deviceState(t, top.node.NetNS, extDev).empty() }) {
		t.Fatalf("%s, a veth with the Node's InternalIP %s, got no tc programs within 10s", extDev, nodeAddrs[0].Addr())
	}
	onNode := createNodePort(ctx, t, api, "tcnat-nodeip", nodeName, top.pods...)
	waitWho(t, top.client.NetNS, onNode, 1)

	if st := deviceState(t, top.node.NetNS, "tun0"); !st.empty() {
		t.Errorf("tun0, without an Ethernet header, carries tc programs: %+v", st)
	}
	resp, err := http.Get("http://" + kpr.MetricsAddr + "/kpr/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var status struct{ HeaderlessDevices []string }
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(status.HeaderlessDevices, []string{"tun0"}) {
		t.Errorf("the daemon's status names headerless devices %v, want [tun0]", status.HeaderlessDevices)
	}
}
