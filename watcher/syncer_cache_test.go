package watcher

import (
	"net/netip"
	"strconv"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
)

func TestHealthCheckCountsDistinctLocalEndpoints(t *testing.T) {
	local := dataplane.Backend{Addr: netip.MustParseAddr("10.244.0.2"), Port: 8080}
	sameAddrOtherPort := dataplane.Backend{Addr: local.Addr, Port: 9090}
	remote := dataplane.Backend{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080}
	ports := []dataplane.ServicePort{
		{Frontends: []dataplane.Frontend{{Kind: dataplane.NodePort, Backends: []dataplane.Backend{local, remote},
			ExternalBackends: []dataplane.Backend{local}}}},
		{Frontends: []dataplane.Frontend{{Kind: dataplane.NodePort, Backends: []dataplane.Backend{sameAddrOtherPort, remote},
			ExternalBackends: []dataplane.Backend{sameAddrOtherPort}}}},
	}
	svc := &v1.Service{Spec: v1.ServiceSpec{ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 30999}}
	hc := healthCheckOf(svc, ports)
	if hc == nil || hc.Port != 30999 || hc.LocalEndpoints != 1 {
		t.Fatalf("healthCheckOf = %+v, want port 30999 with 1 local endpoint (one pod, two ports)", hc)
	}
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	if hc := healthCheckOf(svc, ports); hc != nil {
		t.Fatalf("a Cluster-policy Service got a health check: %+v", hc)
	}
}

func TestFullSyncReusesTranslationsOfUnchangedServices(t *testing.T) {
	calls := 0
	tr := standInTranslator
	tr.translate = func(svc *v1.Service, eps []*discoveryv1.EndpointSlice, node desired.Node) ([]dataplane.ServicePort, []desired.PortFacts, []desired.Problem) {
		calls++
		return standInTranslator.translate(svc, eps, node)
	}
	src := &fakeSource{services: map[serviceName]*v1.Service{}, slices: map[serviceName][]*discoveryv1.EndpointSlice{}}
	for i, name := range []string{"a", "b"} {
		src.services[key(name)] = &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name, ResourceVersion: "1"},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0." + strconv.Itoa(i+1),
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		}
	}
	node := desired.Node{Name: "node-a"}
	s := newSyncer(src, func() desired.Node { return node }, &recordingDataplane{calls: make(chan dpCall, 10)}, tr, zap.NewNop())
	if _, err := s.full(); err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Fatalf("first full sync translated %d Services, want 2", calls)
	}
	src.services[key("a")].ResourceVersion = "2"
	if _, err := s.full(); err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Fatalf("second full sync translated %d more Services, want only the changed one", calls-2)
	}
	node.Zone = "zone-b"
	if _, err := s.full(); err != nil {
		t.Fatal(err)
	}
	if calls != 5 {
		t.Fatalf("a node change must retranslate everything; translated %d", calls-3)
	}
}
