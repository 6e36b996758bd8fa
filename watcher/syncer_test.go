package watcher

import (
	"net/netip"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// countNoLocal counts what upstream counts: ports whose endpoints exist
// but not where their Local policy needs them. desired's TestPortFacts
// checks that the facts come out of the translation.
func TestCountNoLocal(t *testing.T) {
	internalDropped := desired.PortFacts{HasEndpoints: true, HasExternalEndpoints: true}
	externalDropped := desired.PortFacts{HasEndpoints: true, HasInternalEndpoints: true}
	served := desired.PortFacts{HasEndpoints: true, HasInternalEndpoints: true, HasExternalEndpoints: true}
	for _, tc := range []struct {
		name  string
		facts []desired.PortFacts
		want  noLocalCount
	}{
		{"no ports", nil, noLocalCount{}},
		{"endpoints, local ones where needed", []desired.PortFacts{served}, noLocalCount{}},
		{"no endpoints at all: rejected, not counted", []desired.PortFacts{{}}, noLocalCount{}},
		{"internal Local, endpoints elsewhere only", []desired.PortFacts{internalDropped}, noLocalCount{internal: 1}},
		{"external Local, endpoints elsewhere only", []desired.PortFacts{externalDropped}, noLocalCount{external: 1}},
		{"both Local, endpoints elsewhere only", []desired.PortFacts{{HasEndpoints: true}}, noLocalCount{internal: 1, external: 1}},
		{"counted per port", []desired.PortFacts{internalDropped, served, internalDropped, externalDropped},
			noLocalCount{internal: 2, external: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := countNoLocal(tc.facts); got != tc.want {
				t.Errorf("countNoLocal = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The syncer counts from the real translation's facts, in one translation:
// the cases where the frontends alone cannot tell (a Local ClusterIP
// frontend without backends) included.
func TestComputeCountsNoLocalFromDesired(t *testing.T) {
	node := desired.Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.10")}}
	policies := func(internal v1.ServiceInternalTrafficPolicy, external v1.ServiceExternalTrafficPolicy) *v1.Service {
		svc := kubeobj.Service(testNamespace, "web", kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080})
		svc.ResourceVersion = "1"
		svc.Spec.Type = v1.ServiceTypeNodePort
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10"}
		svc.Spec.InternalTrafficPolicy, svc.Spec.ExternalTrafficPolicy = &internal, external
		return svc
	}
	const local, cluster = v1.ServiceInternalTrafficPolicyLocal, v1.ServiceInternalTrafficPolicyCluster
	const extLocal, extCluster = v1.ServiceExternalTrafficPolicyLocal, v1.ServiceExternalTrafficPolicyCluster
	onNode := func(name string) kubeobj.Endpoint {
		return kubeobj.Endpoint{Addr: netip.MustParseAddr("10.244.0.5"), NodeName: name}
	}
	for _, tc := range []struct {
		name      string
		svc       *v1.Service
		endpoints []kubeobj.Endpoint
		want      noLocalCount
	}{
		{"both Local, endpoint on another node", policies(local, extLocal), []kubeobj.Endpoint{onNode("node-b")}, noLocalCount{internal: 1, external: 1}},
		{"internal Local, endpoint on another node", policies(local, extCluster), []kubeobj.Endpoint{onNode("node-b")}, noLocalCount{internal: 1}},
		{"external Local, endpoint on another node", policies(cluster, extLocal), []kubeobj.Endpoint{onNode("node-b")}, noLocalCount{external: 1}},
		{"both Local, endpoint here", policies(local, extLocal), []kubeobj.Endpoint{onNode("node-a")}, noLocalCount{}},
		{"both Local, no endpoints", policies(local, extLocal), nil, noLocalCount{}},
		{"Cluster policies", policies(cluster, extCluster), []kubeobj.Endpoint{onNode("node-b")}, noLocalCount{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slice := kubeobj.Slice(tc.svc, "web-abc", discoveryv1.AddressTypeIPv4, tc.endpoints...)
			slice.ResourceVersion = "1"
			src := &fakeSource{
				services: map[serviceName]*v1.Service{key("web"): tc.svc},
				slices:   map[serviceName][]*discoveryv1.EndpointSlice{key("web"): {slice}},
			}
			s := newSyncer(src, nil, nil, zap.NewNop())
			if got := s.compute(key("web"), node).noLocal; got != tc.want {
				t.Errorf("noLocal = %+v, want %+v", got, tc.want)
			}
		})
	}
}
