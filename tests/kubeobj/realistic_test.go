package kubeobj

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The last-applied annotation must be the manifest itself, as kubectl
// writes it: the benchmarks' memory numbers depend on its size.
func TestDressServiceLastAppliedIsTheManifest(t *testing.T) {
	svc := DressService(Service("shop", "web-7", Port{Name: "http", Port: 80, TargetPort: 8080}), 7)
	var applied v1.Service
	if err := json.Unmarshal([]byte(svc.Annotations[LastAppliedAnnotation]), &applied); err != nil {
		t.Fatalf("last-applied-configuration is not a Service: %v", err)
	}
	if applied.Kind != "Service" || applied.APIVersion != "v1" || applied.Name != svc.Name || applied.Namespace != svc.Namespace {
		t.Errorf("last-applied-configuration names %s %s %s/%s", applied.APIVersion, applied.Kind, applied.Namespace, applied.Name)
	}
	if !reflect.DeepEqual(applied.Labels, svc.Labels) || !reflect.DeepEqual(applied.Spec.Ports, svc.Spec.Ports) ||
		!reflect.DeepEqual(applied.Spec.Selector, svc.Spec.Selector) {
		t.Errorf("last-applied-configuration differs from the Service: %+v", applied)
	}
	if _, ok := applied.Annotations[LastAppliedAnnotation]; ok || len(applied.Annotations) != len(svc.Annotations)-1 {
		t.Errorf("last-applied-configuration annotations %v, want the Service's other annotations", applied.Annotations)
	}
}

func TestDressSliceCopiesTheServiceAsTheController(t *testing.T) {
	svc := DressService(Service("shop", "web-7", Port{Name: "http", Port: 80, TargetPort: 8080}), 7)
	svc.UID = "uid-1"
	slice := DressSlice(Slice(svc, "web-7-abcde", discoveryv1.AddressTypeIPv4,
		Endpoint{Addr: netip.MustParseAddr("10.0.0.1")}, Endpoint{Addr: netip.MustParseAddr("10.0.0.2"), Ready: Bool(false)}), svc)
	for k, v := range svc.Labels {
		if slice.Labels[k] != v {
			t.Errorf("slice label %s = %q, want the Service's %q", k, slice.Labels[k], v)
		}
	}
	if slice.Labels[discoveryv1.LabelServiceName] != svc.Name || len(slice.OwnerReferences) != 1 || slice.OwnerReferences[0].UID != svc.UID {
		t.Errorf("slice does not point at its Service: labels %v, owners %v", slice.Labels, slice.OwnerReferences)
	}
	if _, ok := slice.Annotations[v1.EndpointsLastChangeTriggerTime]; !ok {
		t.Error("slice has no last-change-trigger-time")
	}
	a, b := slice.Endpoints[0], slice.Endpoints[1]
	if a.TargetRef == nil || b.TargetRef == nil || a.TargetRef.Name == b.TargetRef.Name || a.Zone == nil {
		t.Errorf("endpoints lack distinct pod references or zones: %+v %+v", a, b)
	}
	if *b.Conditions.Ready || *b.Conditions.Serving || *b.Conditions.Terminating || !*a.Conditions.Ready {
		t.Errorf("conditions not as set or defaulted: %+v %+v", a.Conditions, b.Conditions)
	}
}
