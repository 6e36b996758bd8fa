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
	"github.com/kpr-io/kpr/health"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// The health check of an externalTrafficPolicy: Local Service counts this
// node's ready endpoints, each pod once however many ports it serves. A
// node left with only terminating endpoints answers 503 (none counted), as
// kube-proxy's does, so the load balancer drains it, while its NodePort
// still serves them: upstream's "should fail health check node port if
// there are only terminating endpoints".
func TestHealthCheckCountsReadyLocalEndpoints(t *testing.T) {
	svc := kubeobj.Service(testNamespace, "web",
		kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080},
		kubeobj.Port{Name: "admin", Port: 81, TargetPort: 9090, NodePort: 30081})
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10"}
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 30999
	node := desired.Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.1")}}
	local, remote := netip.MustParseAddr("10.244.0.2"), netip.MustParseAddr("10.244.1.2")
	translate := func(localEndpoint kubeobj.Endpoint) (*health.Service, []dataplane.ServicePort) {
		t.Helper()
		localEndpoint.Addr, localEndpoint.NodeName = local, node.Name
		slice := kubeobj.Slice(svc, "web-1", discoveryv1.AddressTypeIPv4,
			localEndpoint, kubeobj.Endpoint{Addr: remote, NodeName: "node-b"})
		ports, facts, problems := desired.Translate(svc, []*discoveryv1.EndpointSlice{slice}, node)
		if len(problems) > 0 {
			t.Fatalf("translating: %v", problems)
		}
		return healthCheckOf(svc, facts), ports
	}

	hc, _ := translate(kubeobj.Endpoint{})
	if hc == nil || hc.Port != 30999 || hc.LocalEndpoints != 1 {
		t.Fatalf("ready local endpoint: healthCheckOf = %+v, want port 30999 with 1 local endpoint (one pod, two ports)", hc)
	}

	hc, ports := translate(kubeobj.Endpoint{Ready: kubeobj.Bool(false), Serving: kubeobj.Bool(true), Terminating: kubeobj.Bool(true)})
	if hc == nil || hc.LocalEndpoints != 0 {
		t.Fatalf("only a terminating local endpoint: healthCheckOf = %+v, want 0 local endpoints (503)", hc)
	}
	for _, sp := range ports {
		for _, fe := range sp.Frontends {
			if fe.Kind == dataplane.NodePort && (len(fe.ExternalBackends) != 1 || fe.ExternalBackends[0].Addr != local) {
				t.Errorf("%v NodePort %v: external backends %v, want the terminating local endpoint still served", sp.Name, fe.AddrPort(), fe.ExternalBackends)
			}
		}
	}

	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	if hc, _ := translate(kubeobj.Endpoint{}); hc != nil {
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
