package tcnat

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// `kpr run` without --devices on a node whose uplink is a veth and that has
// no default route: the veth carries the Node object's InternalIP, so it is
// the node's device, and gets the tc programs once kpr has read the Node; a
// NodePort then answers from outside.
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
	runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--tc-attach", "auto")

	if !eventually(10*time.Second, func() bool { return !deviceState(t, top.node.NetNS, extDev).empty() }) {
		t.Fatalf("%s, a veth with the Node's InternalIP %s, got no tc programs within 10s", extDev, nodeAddrs[0].Addr())
	}
	const ns = "tcnat-nodeip"
	if _, err := api.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	np := kubeobj.Service(ns, "np", kubeobj.Port{Name: "tcp", Port: 80, TargetPort: echoPort})
	np.Spec.Type = v1.ServiceTypeNodePort
	np, err := api.CreateService(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	ep := kubeobj.Endpoint{Addr: top.pods[0].IPv4, NodeName: nodeName}
	if err := api.ApplySlice(ctx, kubeobj.Slice(np, "np-ipv4", discoveryv1.AddressTypeIPv4, ep)); err != nil {
		t.Fatal(err)
	}
	waitWho(t, top.client.NetNS, netip.AddrPortFrom(nodeAddrs[0].Addr(), uint16(np.Spec.Ports[0].NodePort)), 1)
}
