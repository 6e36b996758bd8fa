package watcher

import (
	"net/netip"
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"time"

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
	want, wantFacts, wantProblems := desired.Translate(svc, []*discoveryv1.EndpointSlice{slice}, node)

	trimmedSvc, slim := svc.DeepCopy(), slice.DeepCopy()
	if _, err := trimForCache(trimmedSvc); err != nil {
		t.Fatal(err)
	}
	if _, err := trimForCache(slim); err != nil {
		t.Fatal(err)
	}
	got, gotFacts, gotProblems := desired.Translate(trimmedSvc, []*discoveryv1.EndpointSlice{slim}, node)
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotFacts, wantFacts) || !reflect.DeepEqual(gotProblems, wantProblems) {
		t.Fatalf("trimming changed the translation:\n got %+v %+v %v\nwant %+v %+v %v", got, gotFacts, gotProblems, want, wantFacts, wantProblems)
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

// dressedSlice is an EndpointSlice of 10 endpoints as the EndpointSlice
// controller writes it for a Helm-installed Service, encoded as the API
// server sends it.
func dressedSlice(tb testing.TB, i int) []byte {
	tb.Helper()
	svc := kubeobj.DressService(kubeobj.Service("shop", kubeobj.Name("web", i), kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080}), i)
	svc.UID = "0d8b1c3e-2a4f-4b8e-9c1d-3f5e6a7b8c9d"
	svc.CreationTimestamp = metav1.Now()
	var eps []kubeobj.Endpoint
	for j := range 10 {
		eps = append(eps, kubeobj.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)}), NodeName: "node-" + strconv.Itoa(j%3)})
	}
	slice := kubeobj.DressSlice(kubeobj.Slice(svc, svc.Name+"-x7k2p", discoveryv1.AddressTypeIPv4, eps...), svc)
	slice.UID = "5e6a7b8c-2a4f-4b8e-9c1d-0d8b1c3e9c1d"
	slice.ResourceVersion = strconv.Itoa(100000 + i)
	slice.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: kubeobj.FieldManagerController, Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 1500)}}}
	b, err := slice.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestPackedSliceTranslatesTheSame(t *testing.T) {
	var slice discoveryv1.EndpointSlice
	if err := slice.Unmarshal(dressedSlice(t, 3)); err != nil {
		t.Fatal(err)
	}
	// Every condition state, a second address, hints and an app protocol,
	// so that sharing cannot mix values up.
	slice.Endpoints[1].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	slice.Endpoints[2].Conditions = discoveryv1.EndpointConditions{}
	slice.Endpoints[3].Addresses = append(slice.Endpoints[3].Addresses, "10.244.9.9")
	slice.Endpoints[4].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	slice.Ports[0].AppProtocol = ptr.To("kubernetes.io/h2c")
	svc := kubeobj.Service("shop", "web-3", kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080})
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.0.3", []string{"10.96.0.3"}
	node := desired.Node{Name: "node-1", Zone: "zone-b"}

	want, wantFacts, wantProblems := desired.Translate(svc, []*discoveryv1.EndpointSlice{&slice}, node)
	packed := slice.DeepCopy()
	if _, err := trimForCache(packed); err != nil {
		t.Fatal(err)
	}
	got, gotFacts, gotProblems := desired.Translate(svc, []*discoveryv1.EndpointSlice{packed}, node)
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotFacts, wantFacts) || !reflect.DeepEqual(gotProblems, wantProblems) {
		t.Fatalf("packing changed the translation:\n got %+v %+v %v\nwant %+v %+v %v", got, gotFacts, gotProblems, want, wantFacts, wantProblems)
	}
	// Apart from what trimming drops, every value is as decoded.
	kept := slice.DeepCopy()
	kept.ManagedFields, kept.OwnerReferences, kept.UID = nil, nil, ""
	kept.Labels = map[string]string{discoveryv1.LabelServiceName: "web-3"}
	for i := range kept.Endpoints {
		kept.Endpoints[i].TargetRef = nil
		kept.Endpoints[i].Zone = nil // topology reads hints and the node's zone
	}
	if !reflect.DeepEqual(packed, kept) {
		t.Fatalf("packing changed a value kpr may read:\n got %+v\nwant %+v", packed, kept)
	}
}

// TestTrimmedSliceIsSmall holds the cache's cost per EndpointSlice: at
// 10,000 Services the slices are the largest part of kpr's memory. The
// limit is between the in-place trim's 3.9 KB and the packed 2.5 KB per
// slice of 10 endpoints.
func TestTrimmedSliceIsSmall(t *testing.T) {
	const n = 2000
	encoded := make([][]byte, n)
	for i := range encoded {
		encoded[i] = dressedSlice(t, i)
	}
	kept := make([]any, n)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range kept {
		slice := &discoveryv1.EndpointSlice{}
		if err := slice.Unmarshal(encoded[i]); err != nil {
			t.Fatal(err)
		}
		var err error
		if kept[i], err = trimForCache(slice); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(encoded) // freeing them in between would make kept look smaller
	runtime.KeepAlive(kept)
	perSlice := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	t.Logf("%d bytes of heap per cached slice of 10 endpoints", perSlice)
	if perSlice > 3000 {
		t.Fatalf("a cached EndpointSlice of 10 endpoints keeps %d bytes of heap, want at most 3000", perSlice)
	}
}

func TestCacheTransformKeepsOnlyTriggerTimesAfterStart(t *testing.T) {
	started := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	transform := cacheTransform(started)
	svc := kubeobj.Service("shop", "web", kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080})
	for _, tc := range []struct {
		trigger string
		kept    bool
	}{
		{started.Add(-time.Hour).Format(time.RFC3339Nano), false},
		{started.Format(time.RFC3339Nano), false},
		{started.Add(time.Millisecond).Format(time.RFC3339Nano), true},
		{"not a time", true}, // for the handler to log
	} {
		slice := kubeobj.Slice(svc, "web-1", discoveryv1.AddressTypeIPv4)
		slice.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: tc.trigger, "other": "x"}
		out, err := transform(slice)
		if err != nil {
			t.Fatal(err)
		}
		got := out.(*discoveryv1.EndpointSlice).Annotations
		if want := map[string]string{v1.EndpointsLastChangeTriggerTime: tc.trigger}; tc.kept && !reflect.DeepEqual(got, want) {
			t.Errorf("trigger time %s: cached annotations %v, want %v", tc.trigger, got, want)
		}
		if !tc.kept && got != nil {
			t.Errorf("trigger time %s, not after kpr started: cached annotations %v, want none", tc.trigger, got)
		}
	}
}
