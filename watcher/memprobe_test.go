package watcher

import (
	"fmt"
	"runtime"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/tests/memprobe"
)

// BenchmarkSyncerStateHeap reports the live heap of what the syncer keeps
// after a full sync (cached translations, what the dataplane holds, the
// per-Service counters) at 10,000 one-port ClusterIP Services of 10 ready
// endpoints each, the shape of tests/syncperf. A measurement, run by hand:
//
//	go test ./watcher -run '^$' -bench SyncerStateHeap -benchtime 1x
func BenchmarkSyncerStateHeap(b *testing.B) {
	for range b.N {
		b.ReportMetric(float64(syncerStateBytes(b, 10000, 10))/1e6, "state-MB")
	}
}

// TestSyncerStateIsCompact keeps the syncer's state near its size now:
// about 0.9 KB per one-port Service of 10 endpoints, more than half of it the
// translation itself (10 backends of 32 bytes, the frontend, the
// ServicePort) and its versions string. It was 1.5 KB with a Go map of
// ports per Service and a second map for the no-local counts.
func TestSyncerStateIsCompact(t *testing.T) {
	const services = 10000
	perService := float64(syncerStateBytes(t, services, 10)) / services
	if perService > 1000 {
		t.Fatalf("the syncer keeps %.0f bytes per one-port Service, want at most 1000: at 10,000 Services every 100 bytes is 1 MB of kpr's heap", perService)
	}
}

type nopDataplane struct{}

func (nopDataplane) Apply(map[dataplane.ServicePortName]*dataplane.ServicePort) error     { return nil }
func (nopDataplane) Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort) error { return nil }

// syncerStateBytes fully syncs services Services of perService endpoints
// with the real translation and returns the live heap of the syncer's
// state, the informer objects not counted.
func syncerStateBytes(tb testing.TB, services, perService int) uint64 {
	src := clusterIPSource(services, perService)
	node := desired.Node{Name: "node-a"}
	s := newSyncer(src, func() desired.Node { return node }, nopDataplane{}, zap.NewNop())
	n, err := s.full()
	if err != nil || n != services || len(s.problems) != 0 {
		tb.Fatalf("full sync: %d ports, %v, problems with %d Services; want %d ports and no problems", n, err, len(s.problems), services)
	}
	with := memprobe.LiveHeap()
	s.translated, s.applied, s.healthChecks, s.problems = nil, nil, nil, nil
	without := memprobe.LiveHeap()
	runtime.KeepAlive(s)
	runtime.KeepAlive(src)
	return with - without
}

// clusterIPSource holds services one-port ClusterIP Services with one
// slice of perService ready endpoints each, all addresses distinct: the
// shape of tests/syncperf.
func clusterIPSource(services, perService int) *fakeSource {
	src := &fakeSource{services: map[serviceName]*v1.Service{}, slices: map[serviceName][]*discoveryv1.EndpointSlice{}}
	for i := range services {
		name := fmt.Sprintf("svc-%05d", i)
		k := key(name)
		src.services[k] = &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name, ResourceVersion: fmt.Sprint(100000 + 2*i),
				UID: types.UID(fmt.Sprintf("5e0b1a9c-0000-4000-8000-%012d", i))},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("10.96.%d.%d", i>>8, i&255),
				Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name + "-abcde", ResourceVersion: fmt.Sprint(100001 + 2*i),
				Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for j := range perService {
			n := i*perService + j
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("100.%d.%d.%d", 64+n>>16, (n>>8)&255, n&255)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			})
		}
		src.slices[k] = []*discoveryv1.EndpointSlice{slice}
	}
	return src
}
