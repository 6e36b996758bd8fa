package watcher

import (
	"net/netip"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// A Service and slice as a real cluster writes them: Helm and kubectl
// labels and annotations, owner references, the labels the EndpointSlice
// controller copies from the Service, pod references.
func clutteredObjects() (*v1.Service, *discoveryv1.EndpointSlice) {
	svc := kubeobj.Service("shop", "web", kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080})
	svc.UID = "7d1c"
	svc.ResourceVersion = "42"
	svc.Spec.ClusterIP = "10.96.0.10"
	svc.Spec.ClusterIPs = []string{"10.96.0.10"}
	svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svc.Spec.Selector = map[string]string{"app": "web"}
	svc.Labels = map[string]string{"app.kubernetes.io/name": "web", "helm.sh/chart": "web-1.2.3"}
	svc.Annotations = map[string]string{"meta.helm.sh/release-name": "web",
		"kubectl.kubernetes.io/last-applied-configuration": `{"kind":"Service"}`}
	svc.Finalizers = []string{"service.kubernetes.io/load-balancer-cleanup"}
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "helm"}}

	slice := kubeobj.Slice(svc, "web-abc12", discoveryv1.AddressTypeIPv4,
		kubeobj.Endpoint{Addr: netip.MustParseAddr("10.244.0.5"), NodeName: "node-a", Zone: "zone-a",
			ZoneHints: []string{"zone-a"}})
	slice.Labels["app.kubernetes.io/name"] = "web"
	slice.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-11-30T09:00:00Z",
		"endpoints.kubernetes.io/managed-by-setup": "x"}
	slice.OwnerReferences = []metav1.OwnerReference{{Kind: "Service", Name: "web", UID: "7d1c"}}
	slice.Endpoints[0].TargetRef = &v1.ObjectReference{Kind: "Pod", Name: "web-5f9c"}
	slice.Endpoints[0].Hostname = ptr.To("web-5f9c")
	return svc, slice
}

func TestTrimForCacheKeepsWhatKprReads(t *testing.T) {
	svc, slice := clutteredObjects()
	node := desired.Node{Name: "node-a", Zone: "zone-a"}
	want, wantProblems := desired.Translate(svc, []*discoveryv1.EndpointSlice{slice}, node)

	trimmedSvc, slim := svc.DeepCopy(), slice.DeepCopy()
	if _, err := trimForCache(trimmedSvc); err != nil {
		t.Fatal(err)
	}
	if _, err := trimForCache(slim); err != nil {
		t.Fatal(err)
	}
	got, gotProblems := desired.Translate(trimmedSvc, []*discoveryv1.EndpointSlice{slim}, node)
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotProblems, wantProblems) {
		t.Fatalf("trimming changed the translation:\n got %+v %v\nwant %+v %v", got, gotProblems, want, wantProblems)
	}
	if objectVersions(trimmedSvc, []*discoveryv1.EndpointSlice{slim}) != objectVersions(svc, []*discoveryv1.EndpointSlice{slice}) {
		t.Fatal("trimming changed the object versions the translation cache is keyed on")
	}
	if _, ok := slim.Annotations[v1.EndpointsLastChangeTriggerTime]; !ok {
		t.Fatal("the slice lost its last-change-trigger-time, which the programming latency metric reads")
	}

	// What goes.
	if trimmedSvc.Labels != nil || trimmedSvc.Annotations != nil || trimmedSvc.Spec.Selector != nil ||
		trimmedSvc.Finalizers != nil || trimmedSvc.ManagedFields != nil {
		t.Errorf("Service keeps what kpr never reads: %+v", trimmedSvc.ObjectMeta)
	}
	if len(slim.Labels) != 1 || len(slim.Annotations) != 1 || slim.OwnerReferences != nil ||
		slim.Endpoints[0].TargetRef != nil || slim.Endpoints[0].Hostname != nil || slim.Endpoints[0].Zone != nil {
		t.Errorf("EndpointSlice keeps what kpr never reads: %+v %+v", slim.ObjectMeta, slim.Endpoints[0])
	}
}

func TestTrimForCacheKeepsTheProxyNameLabel(t *testing.T) {
	svc, _ := clutteredObjects()
	svc.Labels[desired.LabelServiceProxyName] = "other-proxy"
	if _, err := trimForCache(svc); err != nil {
		t.Fatal(err)
	}
	if skip, _ := desired.SkipService(svc); !skip {
		t.Fatal("a Service of another proxy is no longer skipped after trimming")
	}
}
