package watcher

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// dressedPair is a Service and its slice as Helm, kubectl and the
// EndpointSlice controller leave them, with every field the trimming
// decoder skips set, and some it must keep.
func dressedPair(i int) (*v1.Service, *discoveryv1.EndpointSlice) {
	svc := kubeobj.DressService(kubeobj.Service("shop", kubeobj.Name("web", i),
		kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080}, kubeobj.Port{Name: "dns", Port: 53, TargetPort: 53, Protocol: v1.ProtocolUDP}), i)
	svc.UID = "0d8b1c3e-2a4f-4b8e-9c1d-3f5e6a7b8c9d"
	svc.ResourceVersion = strconv.Itoa(5000 + i)
	svc.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	svc.Finalizers = []string{"service.kubernetes.io/load-balancer-cleanup"}
	svc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "u"}}
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: kubeobj.FieldManagerHelm, Operation: metav1.ManagedFieldsOperationApply,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{}}}`)}}}
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.0.7", []string{"10.96.0.7"}
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 31000
	svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
	svc.Labels[desired.LabelServiceProxyName] = "kpr" // kept, whatever the selector
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.7"}}
	svc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "R", LastTransitionTime: svc.CreationTimestamp}}

	var eps []kubeobj.Endpoint
	for j := range 10 {
		eps = append(eps, kubeobj.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)}), NodeName: "node-" + strconv.Itoa(j%3)})
	}
	slice := kubeobj.DressSlice(kubeobj.Slice(svc, svc.Name+"-x7k2p", discoveryv1.AddressTypeIPv4, eps...), svc)
	slice.UID = "5e6a7b8c-2a4f-4b8e-9c1d-0d8b1c3e9c1d"
	slice.ResourceVersion = strconv.Itoa(100000 + i)
	// A trigger time after any start, so that the cache keeps it.
	slice.Annotations[v1.EndpointsLastChangeTriggerTime] = "2099-01-01T00:00:00Z"
	slice.Endpoints[1].Hostname = ptr.To("web-1")
	slice.Endpoints[2].DeprecatedTopology = map[string]string{"topology.kubernetes.io/zone": "zone-a"}
	slice.Endpoints[3].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	slice.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: kubeobj.FieldManagerController, Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 1500)}}}
	return svc, slice
}

// protobufServer serves svcs and slices as the API server does, in
// protobuf: single objects, lists, and a watch stream of ADDED events.
func protobufServer(t testing.TB, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) *httptest.Server {
	t.Helper()
	codecs := serializer.NewCodecFactory(apiclient.Scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	encode := func(obj runtime.Object, gv schema.GroupVersion) []byte {
		b, err := runtime.Encode(codecs.EncoderForVersion(info.Serializer, gv), obj)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	svcList := &v1.ServiceList{}
	var svcObjs, sliceObjs []runtime.Object
	for _, s := range svcs {
		svcList.Items = append(svcList.Items, *s)
		svcObjs = append(svcObjs, s)
	}
	sliceList := &discoveryv1.EndpointSliceList{}
	for _, s := range slices {
		sliceList.Items = append(sliceList.Items, *s)
		sliceObjs = append(sliceObjs, s)
	}
	// Encoded once, so that a benchmark times the client alone.
	type encoded struct{ one, list, stream []byte }
	encodeAll := func(gv schema.GroupVersion, list runtime.Object, objs []runtime.Object, bookmark runtime.Object) encoded {
		e := encoded{one: encode(objs[0], gv), list: encode(list, gv)}
		var stream bytes.Buffer
		frames := info.StreamSerializer.Framer.NewFrameWriter(&stream)
		for _, obj := range objs {
			ev := &metav1.WatchEvent{Type: string(watch.Added), Object: runtime.RawExtension{Raw: encode(obj, gv)}}
			if err := info.StreamSerializer.Serializer.Encode(ev, frames); err != nil {
				t.Fatal(err)
			}
		}
		// The end of the initial events, as a watch list sends it.
		ev := &metav1.WatchEvent{Type: string(watch.Bookmark), Object: runtime.RawExtension{Raw: encode(bookmark, gv)}}
		if err := info.StreamSerializer.Serializer.Encode(ev, frames); err != nil {
			t.Fatal(err)
		}
		e.stream = stream.Bytes()
		return e
	}
	serve := func(e encoded) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Query().Get("watch") == "true":
				w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
				w.Write(e.stream)
			case r.URL.Query().Get("one") != "":
				w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
				w.Write(e.one)
			default:
				w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
				w.Write(e.list)
			}
		}
	}
	mux := http.NewServeMux()
	endMeta := metav1.ObjectMeta{ResourceVersion: "200000", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}
	mux.HandleFunc("/api/v1/services", serve(encodeAll(v1.SchemeGroupVersion, svcList, svcObjs, &v1.Service{ObjectMeta: endMeta})))
	mux.HandleFunc("/apis/discovery.k8s.io/v1/endpointslices", serve(encodeAll(discoveryv1.SchemeGroupVersion, sliceList, sliceObjs, &discoveryv1.EndpointSlice{ObjectMeta: endMeta})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// decodedAllWays returns what client decodes of the Services and slices
// served, by a single GET, a list and a watch, in that order.
func decodedAllWays(t *testing.T, client *apiclient.Clients) (svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	for _, c := range []struct {
		client   rest.Interface
		resource string
		one      runtime.Object
		list     runtime.Object
	}{
		{client.Core, "services", &v1.Service{}, &v1.ServiceList{}},
		{client.Discovery, "endpointslices", &discoveryv1.EndpointSlice{}, &discoveryv1.EndpointSliceList{}},
	} {
		if err := c.client.Get().Resource(c.resource).Param("one", "1").Do(ctx).Into(c.one); err != nil {
			t.Fatalf("GET one of %s: %v", c.resource, err)
		}
		if err := c.client.Get().Resource(c.resource).Do(ctx).Into(c.list); err != nil {
			t.Fatalf("list %s: %v", c.resource, err)
		}
		w, err := c.client.Get().Resource(c.resource).Param("watch", "true").Watch(ctx)
		if err != nil {
			t.Fatalf("watch %s: %v", c.resource, err)
		}
		var watched []runtime.Object
		ended := false
		for ev := range w.ResultChan() {
			switch {
			case ev.Type == watch.Added && !ended:
				watched = append(watched, ev.Object)
			case ev.Type == watch.Bookmark && !ended:
				// An informer waits for this annotation to know that the
				// initial list is complete.
				obj, err := meta.Accessor(ev.Object)
				if err != nil || obj.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
					t.Fatalf("watch %s: the bookmark lost its end-of-initial-events mark: %+v", c.resource, ev.Object)
				}
				ended = true
			default:
				t.Fatalf("watch %s: %v event: %+v", c.resource, ev.Type, ev.Object)
			}
		}
		if !ended {
			t.Fatalf("watch %s: no bookmark", c.resource)
		}
		switch one := c.one.(type) {
		case *v1.Service:
			svcs = append(svcs, one)
			for i := range c.list.(*v1.ServiceList).Items {
				svcs = append(svcs, &c.list.(*v1.ServiceList).Items[i])
			}
			for _, obj := range watched {
				svcs = append(svcs, obj.(*v1.Service))
			}
		case *discoveryv1.EndpointSlice:
			slices = append(slices, one)
			for i := range c.list.(*discoveryv1.EndpointSliceList).Items {
				slices = append(slices, &c.list.(*discoveryv1.EndpointSliceList).Items[i])
			}
			for _, obj := range watched {
				slices = append(slices, obj.(*discoveryv1.EndpointSlice))
			}
		}
	}
	return svcs, slices
}

var watcherTrim = apiclient.Trim{ServiceLabels: serviceLabels, SliceLabels: sliceLabels, SliceAnnotations: sliceAnnotations}

// TestTrimmedDecodingCachesTheSameObjects holds the trimming decoder to
// what it is for: the cache holds exactly what it held when objects were
// decoded whole, and only the decoding changed: what the transform drops
// is not decoded at all.
func TestTrimmedDecodingCachesTheSameObjects(t *testing.T) {
	var svcs []*v1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := range 3 {
		svc, slice := dressedPair(i)
		svcs, slices = append(svcs, svc), append(slices, slice)
	}
	srv := protobufServer(t, svcs, slices)
	whole, err := apiclient.ForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	trimming, err := whole.Trimmed(watcherTrim)
	if err != nil {
		t.Fatal(err)
	}
	wholeSvcs, wholeSlices := decodedAllWays(t, whole)
	trimmedSvcs, trimmedSlices := decodedAllWays(t, trimming)
	if len(trimmedSvcs) != 1+2*len(svcs) || len(trimmedSlices) != 1+2*len(slices) {
		t.Fatalf("decoded %d Services and %d slices, want %d each", len(trimmedSvcs), len(trimmedSlices), 1+2*len(svcs))
	}
	transform := cacheTransform(time.Now())
	for i := range wholeSvcs {
		// What the decoder skipped is gone before the transform runs.
		got := trimmedSvcs[i]
		if got.ManagedFields != nil || got.Annotations[kubeobj.LastAppliedAnnotation] != "" || got.Labels["helm.sh/chart"] != "" ||
			got.Spec.Selector != nil || got.Finalizers != nil || got.OwnerReferences != nil || got.Status.Conditions != nil {
			t.Fatalf("Service %d decoded with what the cache drops: %+v", i, got)
		}
		want, _ := transform(wholeSvcs[i].DeepCopy())
		if got, _ := transform(got); !reflect.DeepEqual(got, want) {
			t.Fatalf("Service %d cached differently:\n got %+v\nwant %+v", i, got, want)
		}
	}
	for i := range wholeSlices {
		got := trimmedSlices[i]
		if got.ManagedFields != nil || got.OwnerReferences != nil || got.Labels[discoveryv1.LabelManagedBy] != "" ||
			got.Endpoints[0].TargetRef != nil || got.Endpoints[0].Zone != nil || got.Endpoints[1].Hostname != nil || got.Endpoints[2].DeprecatedTopology != nil {
			t.Fatalf("slice %d decoded with what the cache drops: %+v", i, got)
		}
		want, _ := transform(wholeSlices[i].DeepCopy())
		if got, _ := transform(got); !reflect.DeepEqual(got, want) {
			t.Fatalf("slice %d cached differently:\n got %+v\nwant %+v", i, got, want)
		}
	}
}

// BenchmarkWatchDressed streams 1,000 dressed Services and their slices,
// as the initial watch list does, through the whole and the trimming
// decoder: the allocations are most of start-up's garbage.
//
//	go test ./watcher -run '^$' -bench WatchDressed -benchmem
func BenchmarkWatchDressed(b *testing.B) {
	var svcs []*v1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := range 1000 {
		svc, slice := dressedPair(i)
		svcs, slices = append(svcs, svc), append(slices, slice)
	}
	srv := protobufServer(b, svcs, slices)
	whole, err := apiclient.ForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	trimming, err := whole.Trimmed(watcherTrim)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		client *apiclient.Clients
	}{{"whole", whole}, {"trimmed", trimming}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				for _, c := range []struct {
					client   rest.Interface
					resource string
				}{{c.client.Core, "services"}, {c.client.Discovery, "endpointslices"}} {
					w, err := c.client.Get().Resource(c.resource).Param("watch", "true").Watch(ctx)
					if err != nil {
						b.Fatal(err)
					}
					for range w.ResultChan() {
					}
				}
			}
		})
	}
}
