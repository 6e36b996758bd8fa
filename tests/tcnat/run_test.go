package tcnat

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// `kpr run --devices` against a real API server: Services created as
// Kubernetes objects are served to the client outside the node, a NodePort
// on the node's address and an ExternalIP with externalTrafficPolicy:
// Local, which reaches only the node's own endpoint.
func TestKprRunServesTrafficFromOutside(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName = "kpr-tcnat-node"
	cl, api := testCluster(ctx, t, nodeName)
	top := buildTopology(t, 2)
	runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--devices", extDev)
	const ns = "tcnat"
	onNode := createNodePort(ctx, t, api, ns, nodeName, top.pods...)
	seen := waitWho(t, top.client.NetNS, onNode, 2)
	t.Logf("NodePort %s from outside reached %v", onNode, seen)

	endpoints := func(svc *v1.Service, nodes ...string) {
		t.Helper()
		var eps []kubeobj.Endpoint
		for i, p := range top.pods {
			eps = append(eps, kubeobj.Endpoint{Addr: p.IPv4, NodeName: nodes[i]})
		}
		if err := api.ApplySlice(ctx, kubeobj.Slice(svc, svc.Name+"-ipv4", discoveryv1.AddressTypeIPv4, eps...)); err != nil {
			t.Fatal(err)
		}
	}

	extIP := netip.MustParseAddr("203.0.113.9")
	local := kubeobj.Service(ns, "local", kubeobj.Port{Name: "tcp", Port: 80, TargetPort: echoPort})
	local.Spec.ExternalIPs = []string{extIP.String()}
	local.Spec.Type = v1.ServiceTypeNodePort
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	local, err := api.CreateService(ctx, local)
	if err != nil {
		t.Fatal(err)
	}
	endpoints(local, nodeName, "kpr-tcnat-elsewhere")
	seen = waitWho(t, top.client.NetNS, netip.AddrPortFrom(extIP, 80), 1)
	if !seen[top.pods[0].Name] {
		t.Errorf("externalTrafficPolicy: Local from outside reached %v, want only the local %s", seen, top.pods[0].Name)
	}
}

// waitWho waits until fe answers from ns, then asks it 12 more times, and
// returns the backends that answered; it fails unless want of them did.
func waitWho(t *testing.T, ns *harness.NetNS, fe netip.AddrPort, want int) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := harness.WhoTCP(ns, fe, time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered from outside: %v", fe, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		who, err := harness.WhoTCP(ns, fe, 3*time.Second)
		if err != nil {
			t.Fatalf("%s from outside: %v", fe, err)
		}
		seen[who] = true
	}
	if len(seen) != want {
		t.Errorf("%s from outside reached %v, want %d backends", fe, seen, want)
	}
	return seen
}
