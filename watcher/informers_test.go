package watcher

import (
	"reflect"
	"testing"
	"time"

	"go.uber.org/zap"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

func TestSliceIndexFollowsEvents(t *testing.T) {
	svcA := kubeobj.Service("shop", "a", kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080})
	keyA, keyB := serviceName{Namespace: "shop", Name: "a"}, serviceName{Namespace: "shop", Name: "b"}
	a2 := kubeobj.Slice(svcA, "a-2", discoveryv1.AddressTypeIPv4)
	a1 := kubeobj.Slice(svcA, "a-1", discoveryv1.AddressTypeIPv4)
	a3 := kubeobj.Slice(svcA, "a-3", discoveryv1.AddressTypeIPv4)
	names := func(key serviceName, x *sliceIndex) []string {
		var out []string
		for _, s := range x.slices(key) {
			out = append(out, s.Name)
		}
		return out
	}
	x := newSliceIndex()
	x.update(nil, a2)
	x.update(nil, a1)
	x.update(nil, a3)
	if got := names(keyA, x); !reflect.DeepEqual(got, []string{"a-1", "a-2", "a-3"}) {
		t.Fatalf("after three adds the index holds %v", got)
	}
	// An update replaces the slice, it does not add a second one.
	a2v2 := a2.DeepCopy()
	a2v2.ResourceVersion = "2"
	x.update(a2, a2v2)
	if got := x.slices(keyA); len(got) != 3 || got[1] != a2v2 {
		t.Fatalf("after an update the index holds %v", got)
	}
	// A label edit moves the slice to another Service.
	moved := a2v2.DeepCopy()
	moved.Labels[discoveryv1.LabelServiceName] = "b"
	x.update(a2v2, moved)
	if got, gotB := names(keyA, x), names(keyB, x); !reflect.DeepEqual(got, []string{"a-1", "a-3"}) || !reflect.DeepEqual(gotB, []string{"a-2"}) {
		t.Fatalf("after a move the index holds %v for a, %v for b", got, gotB)
	}
	// A slice that loses its label leaves the index.
	unlabelled := moved.DeepCopy()
	delete(unlabelled.Labels, discoveryv1.LabelServiceName)
	x.update(moved, unlabelled)
	x.update(a1, nil)
	x.update(a3, nil)
	if len(x.byName) != 0 {
		t.Fatalf("after every slice left, the index holds %v", x.byName)
	}
}

// A slice whose Service label is removed no longer belongs to that
// Service, so the Service must be synced again, or its backends stay.
func TestSliceHandlerSyncsTheServiceASliceLeft(t *testing.T) {
	svc := kubeobj.Service("shop", "a", kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080})
	slice := kubeobj.Slice(svc, "a-1", discoveryv1.AddressTypeIPv4)
	index := newSliceIndex()
	tracker := newChangeTracker(metrics.New(), &fakeHealth{}, time.Now)
	h := sliceHandler(index, tracker, time.Now(), zap.NewNop())
	h.OnAdd(slice, true)
	tracker.take()
	unlabelled := slice.DeepCopy()
	delete(unlabelled.Labels, discoveryv1.LabelServiceName)
	h.OnUpdate(slice, unlabelled)
	cs := tracker.take()
	if _, ok := cs.services[serviceName{Namespace: "shop", Name: "a"}]; !ok {
		t.Fatalf("removing the Service label from its slice queued %v, want the Service", cs.services)
	}
	if got := index.slices(serviceName{Namespace: "shop", Name: "a"}); len(got) != 0 {
		t.Fatalf("the Service still has slices %v", got)
	}
}
