package watcher

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/dataplane"
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
