package watcher

import (
	"net/netip"
	"strconv"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/tests/kubeobj"
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

// A full sync translates again only the Services whose objects changed:
// the others keep their cached translation, so the dataplane is handed the
// very same ServicePorts (by pointer) as last time. A node change
// translates every Service again.
func TestFullSyncReusesTranslationsOfUnchangedServices(t *testing.T) {
	src := &fakeSource{services: map[serviceName]*v1.Service{}, slices: map[serviceName][]*discoveryv1.EndpointSlice{}}
	for i, name := range []string{"a", "b"} {
		svc := kubeobj.Service(testNamespace, name, httpPort)
		svc.ResourceVersion = "1"
		svc.Spec.ClusterIP = "10.96.0." + strconv.Itoa(i+1)
		src.services[key(name)] = svc
	}
	node := desired.Node{Name: "node-a"}
	dp := &recordingDataplane{calls: make(chan dpCall, 10)}
	s := newSyncer(src, func() desired.Node { return node }, dp, zap.NewNop())
	// handed does a full sync and returns the ServicePort of a and of b
	// that the dataplane was handed.
	handed := func() (a, b *dataplane.ServicePort) {
		t.Helper()
		if _, err := s.full(); err != nil {
			t.Fatal(err)
		}
		c := <-dp.calls
		a, b = c.ports[portName("a")], c.ports[portName("b")]
		if a == nil || b == nil {
			t.Fatalf("full sync handed %v, want a's and b's ServicePorts", c.ports)
		}
		return a, b
	}
	a1, b1 := handed()
	src.services[key("a")].ResourceVersion = "2"
	a2, b2 := handed()
	if a2 == a1 {
		t.Error("a changed but its cached translation was reused")
	}
	if b2 != b1 {
		t.Error("b did not change but was translated again")
	}
	node.Zone = "zone-b"
	a3, b3 := handed()
	if a3 == a2 || b3 == b2 {
		t.Errorf("a node change must retranslate everything; a reused %v, b reused %v", a3 == a2, b3 == b2)
	}
}
