package tcnat

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// `kpr run --devices` against a real API server with a LoadBalancer
// Service whose loadBalancerSourceRanges admit one of two clients outside
// the node (the entry padded with blanks, as the API lets through): the
// one inside is served on the load-balancer IP, the other is not until the
// ranges are removed from the Service.
func TestKprRunLoadBalancerSourceRanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName = "kpr-tcnat-ranges"
	cl, api := testCluster(ctx, t, nodeName)
	top := buildTopology(t, 1)
	top.addOutsider(t)
	runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--devices", extDev)
	const ns = "ranges"
	if _, err := api.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inside, outside := clientAddr(false), outsiderAddr(false)
	svc, fe := createLoadBalancer(ctx, t, api, top, nodeName, ns, "fenced", netip.MustParseAddr("203.0.113.20"),
		[]string{" " + inside.String() + "/32 "})
	waitWhoFrom(t, top, inside, fe)
	if who, err := whoFrom(top.client.NetNS, outside, fe, time.Second); err == nil {
		t.Errorf("%s from %s, outside loadBalancerSourceRanges, reached %s", fe, outside, who)
	}

	svc.Spec.LoadBalancerSourceRanges = nil
	if _, err := api.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWhoFrom(t, top, outside, fe)
}

// createLoadBalancer creates the LoadBalancer Service ns/name on port 80
// with the given loadBalancerSourceRanges, its load-balancer IP lbIP, and
// its EndpointSlice with the first pod of top, on nodeName. It returns the
// Service as stored and its load-balancer frontend.
func createLoadBalancer(ctx context.Context, t *testing.T, api kubeobj.Client, top *topology, nodeName, ns, name string,
	lbIP netip.Addr, ranges []string) (*v1.Service, netip.AddrPort) {
	t.Helper()
	svc := kubeobj.Service(ns, name, kubeobj.Port{Name: "tcp", Port: 80, TargetPort: echoPort})
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.LoadBalancerSourceRanges = ranges
	svc, err := api.CreateService(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lbIP.String()}}
	if svc, err = api.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.ApplySlice(ctx, kubeobj.Slice(svc, svc.Name+"-ipv4", discoveryv1.AddressTypeIPv4,
		kubeobj.Endpoint{Addr: top.pods[0].IPv4, NodeName: nodeName})); err != nil {
		t.Fatal(err)
	}
	return svc, netip.AddrPortFrom(lbIP, 80)
}

// waitWhoFrom waits until fe answers a connection from src.
func waitWhoFrom(t *testing.T, top *topology, src netip.Addr, fe netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		who, err := whoFrom(top.client.NetNS, src, fe, time.Second)
		if err == nil && who == top.pods[0].Name {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered %s from outside: %q, %v", fe, src, who, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
