package watcher

import (
	"net/netip"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
)

func TestCountNoLocalExternal(t *testing.T) {
	s := newSyncer(&fakeSource{}, nil, nil, standInTranslator, zap.NewNop())
	b := []dataplane.Backend{{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080}}
	nodePort := func(cluster, external []dataplane.Backend) dataplane.ServicePort {
		return dataplane.ServicePort{Frontends: []dataplane.Frontend{
			{Kind: dataplane.ClusterIP, Backends: cluster},
			{Kind: dataplane.NodePort, Backends: cluster, ExternalBackends: external},
		}}
	}
	svc := &v1.Service{}
	for _, tc := range []struct {
		name string
		sp   dataplane.ServicePort
		want int
	}{
		{"Local policy, endpoints elsewhere only", nodePort(b, []dataplane.Backend{}), 1},
		{"Local policy, local endpoint", nodePort(b, b), 0},
		{"Local policy, no endpoints at all", nodePort(nil, []dataplane.Backend{}), 0},
		{"Cluster policy", nodePort(b, nil), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s.countNoLocal(svc, nil, desired.Node{}, []dataplane.ServicePort{tc.sp})
			if got.external != tc.want || got.internal != 0 {
				t.Errorf("countNoLocal = %+v, want external %d", got, tc.want)
			}
		})
	}
}
