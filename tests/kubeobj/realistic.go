package kubeobj

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// The benchmarks write objects as a real cluster holds them, not the bare
// minimum kpr reads: a proxy's memory and its start-up time depend on how
// large the listed objects are, and most of a real object is metadata that
// deployment tools and controllers add. Measured with bare objects, kpr
// looked 25 MiB leaner at 10,000 Services than against a cluster's
// objects (docs/control-plane-performance.md).
//
// What a real cluster's Service carries, and where it comes from:
//   - Helm's labels and release annotations (app.kubernetes.io/*,
//     helm.sh/chart, meta.helm.sh/release-*);
//   - kubectl apply's last-applied-configuration annotation, which holds
//     the whole object as applied, as JSON (also written by Argo CD and
//     anything else built on client-side apply);
//   - managedFields, one entry per writer with every field it set: the
//     API server builds them, so the objects are written the way those
//     tools write them (server-side apply for Helm 4, create with
//     kubectl's field manager for kubectl apply).
//
// And its EndpointSlice, as the EndpointSlice controller writes it: the
// Service's labels copied, the controller's own labels, the
// last-change-trigger-time annotation, an owner reference to the Service,
// per endpoint the pod it points to, node, zone and all three conditions,
// and the controller's managedFields.

// Field managers of the tools whose objects are imitated.
const (
	FieldManagerKubectlApply = "kubectl-client-side-apply"
	FieldManagerHelm         = "helm"
	FieldManagerController   = "kube-controller-manager"
)

// LastAppliedAnnotation is kubectl apply's copy of the applied object.
const LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// realisticZones are the zones endpoints are spread over.
var realisticZones = []string{"zone-a", "zone-b", "zone-c"}

// DressService adds to svc (a Service from Service, not yet created) the
// labels, annotations and selector that a Helm chart installed by kubectl
// apply leaves on it. i numbers the Service and so varies the chart.
// Call CreateDressedService to write it the way those tools do.
func DressService(svc *v1.Service, i int) *v1.Service {
	release := "release-" + strconv.Itoa(i%50)
	chart := "chart-" + strconv.Itoa(i%20)
	svc.Labels = map[string]string{
		"app.kubernetes.io/name":       svc.Name,
		"app.kubernetes.io/instance":   release,
		"app.kubernetes.io/version":    "1." + strconv.Itoa(i%7) + ".3",
		"app.kubernetes.io/component":  "server",
		"app.kubernetes.io/part-of":    chart,
		"app.kubernetes.io/managed-by": "Helm",
		"helm.sh/chart":                chart + "-4.2." + strconv.Itoa(i%9),
	}
	svc.Annotations = map[string]string{
		"meta.helm.sh/release-name":      release,
		"meta.helm.sh/release-namespace": svc.Namespace,
	}
	svc.Spec.Selector = map[string]string{
		"app.kubernetes.io/name":     svc.Name,
		"app.kubernetes.io/instance": release,
	}
	svc.Annotations[LastAppliedAnnotation] = lastApplied(svc)
	return svc
}

// lastApplied renders svc as kubectl apply stores it: the manifest as the
// user wrote it (no status, no server-set fields), compact JSON with a
// trailing newline.
func lastApplied(svc *v1.Service) string {
	manifest := v1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: svc.Name,
			Labels:      svc.Labels,
			Annotations: map[string]string{},
		},
		Spec: v1.ServiceSpec{Type: svc.Spec.Type, Ports: svc.Spec.Ports, Selector: svc.Spec.Selector},
	}
	for k, v := range svc.Annotations {
		if k != LastAppliedAnnotation {
			manifest.Annotations[k] = v
		}
	}
	b, err := json.Marshal(manifest)
	if err != nil {
		panic(err) // a Service always marshals
	}
	return string(b) + "\n"
}

// CreateDressedService writes a Service dressed by DressService as the
// tools that dress it do: even-numbered ones by server-side apply with
// Helm's field manager (Helm 4), odd ones by create with kubectl apply's.
// It returns the Service as stored.
func (c Client) CreateDressedService(ctx context.Context, svc *v1.Service, i int) (*v1.Service, error) {
	if i%2 == 1 {
		out, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: FieldManagerKubectlApply})
		if err != nil {
			return nil, fmt.Errorf("create Service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		return out, nil
	}
	applied := svc.DeepCopy()
	applied.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	body, err := json.Marshal(applied)
	if err != nil {
		return nil, fmt.Errorf("encode Service %s/%s for apply: %w", svc.Namespace, svc.Name, err)
	}
	out, err := c.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManagerHelm, Force: ptr.To(true)})
	if err != nil {
		return nil, fmt.Errorf("server-side apply Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// DressSlice makes slice (of svc as stored, with its UID) look like the
// EndpointSlice controller's: svc's labels copied, the controller's
// labels, the trigger-time annotation, an owner reference, and per
// endpoint a pod reference, zone and conditions (see DressEndpoints).
// Write it with CreateControllerSlice.
func DressSlice(slice *discoveryv1.EndpointSlice, svc *v1.Service) *discoveryv1.EndpointSlice {
	labels := make(map[string]string, len(svc.Labels)+2)
	for k, v := range svc.Labels {
		labels[k] = v
	}
	labels[discoveryv1.LabelServiceName] = svc.Name
	labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	slice.Labels = labels
	slice.Annotations = map[string]string{
		v1.EndpointsLastChangeTriggerTime: svc.CreationTimestamp.UTC().Format(time.RFC3339Nano),
	}
	slice.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	DressEndpoints(svc, slice.Endpoints)
	return slice
}

// DressEndpoints gives each endpoint what the EndpointSlice controller
// copies from its pod: a pod reference with a ReplicaSet-style name, a
// zone, and all three conditions. Fields already set are kept.
func DressEndpoints(svc *v1.Service, eps []discoveryv1.Endpoint) {
	owner := fnv.New32a()
	owner.Write([]byte(svc.Name))
	replicaSet := strconv.FormatUint(uint64(owner.Sum32()), 36)
	for j := range eps {
		e := &eps[j]
		if e.TargetRef == nil && len(e.Addresses) > 0 {
			// One pod per address, named as a Deployment's pods are.
			pod := fnv.New32a()
			pod.Write([]byte(e.Addresses[0]))
			e.TargetRef = &v1.ObjectReference{
				Kind: "Pod", Namespace: svc.Namespace,
				Name: svc.Name + "-" + replicaSet + "-" + strconv.FormatUint(uint64(pod.Sum32()), 36),
				UID:  types.UID(fmt.Sprintf("%08x-0000-4000-8000-%012x", owner.Sum32(), pod.Sum32())),
			}
		}
		if e.Zone == nil {
			e.Zone = ptr.To(realisticZones[j%len(realisticZones)])
		}
		if e.Conditions.Ready == nil {
			e.Conditions.Ready = ptr.To(true)
		}
		if e.Conditions.Serving == nil {
			e.Conditions.Serving = ptr.To(*e.Conditions.Ready)
		}
		if e.Conditions.Terminating == nil {
			e.Conditions.Terminating = ptr.To(false)
		}
	}
}

// CreateControllerSlice creates slice with the EndpointSlice controller's
// field manager, so its managedFields are the controller's.
func (c Client) CreateControllerSlice(ctx context.Context, slice *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	out, err := c.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{FieldManager: FieldManagerController})
	if err != nil {
		return nil, fmt.Errorf("create EndpointSlice %s/%s: %w", slice.Namespace, slice.Name, err)
	}
	return out, nil
}
