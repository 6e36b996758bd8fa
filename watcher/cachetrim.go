package watcher

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kpr-io/kpr/desired"
)

// What the informer caches keep of each object. Every Service and
// EndpointSlice of the cluster sits in them for kpr's lifetime, so each is
// trimmed to what kpr reads, and what slices have in common is shared, as
// the objects arrive (the informers' transform).

// stripManagedFields drops the managed fields of every cached object: they
// are often its largest part, and kpr never reads them. It is the whole
// transform for the Node, of which kpr caches one.
func stripManagedFields(obj any) (any, error) {
	if accessor, err := meta.Accessor(obj); err == nil {
		accessor.SetManagedFields(nil)
	}
	return obj, nil
}

// Labels and annotations kpr reads; every other one is dropped from the
// cache. Helm, kubectl and the EndpointSlice controller (which copies a
// Service's labels onto its slices) put many more there.
var (
	serviceLabels    = []string{desired.LabelServiceProxyName}
	sliceLabels      = []string{discoveryv1.LabelServiceName, v1.IsHeadlessService}
	sliceAnnotations = []string{v1.EndpointsLastChangeTriggerTime}
)

// trimForCache reduces a Service or EndpointSlice to what kpr reads, for
// every object of a large cluster sits in the informer caches for kpr's
// lifetime. Dropped: managed fields, owner references, finalizers, labels
// and annotations kpr does not read, a Service's selector and status
// conditions, a slice's UID, and per endpoint the pod reference, hostname,
// zone and deprecated topology. What is kept of a slice is packed (packSlice).
func trimForCache(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		trimMeta(&o.ObjectMeta, serviceLabels, nil)
		o.Namespace = cacheStrings.value(o.Namespace)
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discoveryv1.EndpointSlice:
		trimMeta(&o.ObjectMeta, sliceLabels, sliceAnnotations)
		// Only the name and resourceVersion identify a slice's version
		// (objectVersions); the UID is 36 bytes per slice kpr never reads.
		o.UID = ""
		packSlice(o)
	default:
		return stripManagedFields(obj)
	}
	return obj, nil
}

// cacheTransform is trimForCache for informers started at started. It also
// drops a slice's last-change-trigger-time when that is not after started:
// the slice handler times only changes after started (triggerTime), so an
// older one is never read, and most slices of a cluster have one. That is
// a map per slice less. A malformed one is kept for the handler to log.
func cacheTransform(started time.Time) cache.TransformFunc {
	return func(obj any) (any, error) {
		out, err := trimForCache(obj)
		if slice, ok := out.(*discoveryv1.EndpointSlice); ok && slice.Annotations != nil {
			if t, err := time.Parse(time.RFC3339Nano, slice.Annotations[v1.EndpointsLastChangeTriggerTime]); err == nil && !t.After(started) {
				slice.Annotations = nil
			}
		}
		return out, err
	}
}

// packSlice shares what a slice's fields have in common with other slices
// instead of keeping the decoder's separate allocation of each: the
// namespace, each endpoint's node and zone, the condition flags, the port
// names, protocols and numbers; and it trims the decoder's spare capacity.
// At 10,000 slices of 10 endpoints that is 100,000 node names, zones and
// pointers to them, and 300,000 condition flags, fewer. The values are
// unchanged; cached objects are never written to, so sharing is safe.
func packSlice(o *discoveryv1.EndpointSlice) {
	o.Namespace = cacheStrings.value(o.Namespace)
	// The decoder appends endpoints one by one, so the array has room for
	// up to twice as many (16 for 10): copy them into one that fits.
	if cap(o.Endpoints) > len(o.Endpoints) {
		o.Endpoints = append([]discoveryv1.Endpoint(nil), o.Endpoints...)
	}
	if cap(o.Ports) > len(o.Ports) {
		o.Ports = append([]discoveryv1.EndpointPort(nil), o.Ports...)
	}
	for i := range o.Endpoints {
		e := &o.Endpoints[i]
		e.TargetRef = nil
		e.Hostname = nil
		e.DeprecatedTopology = nil
		e.NodeName = cacheStrings.pointer(e.NodeName)
		// Topology routing reads the hints and the node's zone, not the
		// endpoint's own zone.
		e.Zone = nil
		e.Conditions.Ready = sharedBool(e.Conditions.Ready)
		e.Conditions.Serving = sharedBool(e.Conditions.Serving)
		e.Conditions.Terminating = sharedBool(e.Conditions.Terminating)
	}
	for i := range o.Ports {
		p := &o.Ports[i]
		p.Name = cacheStrings.pointer(p.Name)
		p.AppProtocol = cacheStrings.pointer(p.AppProtocol)
		p.Protocol = sharedProtocol(p.Protocol)
		p.Port = sharedPort(p.Port)
	}
}

var (
	boolTrue, boolFalse = true, false
	// protocols holds one pointer per protocol the API accepts.
	protocols = func() map[v1.Protocol]*v1.Protocol {
		m := map[v1.Protocol]*v1.Protocol{}
		for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
			m[p] = &p
		}
		return m
	}()
	ports sync.Map // int32 -> *int32
)

// sharedBool returns a shared pointer to *b's value (nil for nil).
func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &boolTrue
	default:
		return &boolFalse
	}
}

// sharedProtocol returns a shared pointer for the protocols the API
// accepts, and p itself for anything else.
func sharedProtocol(p *v1.Protocol) *v1.Protocol {
	if p == nil {
		return nil
	}
	if shared, ok := protocols[*p]; ok {
		return shared
	}
	return p
}

// sharedPort returns a shared pointer to *p's value: there are only 65,536
// port numbers, and a cluster uses few of them.
func sharedPort(p *int32) *int32 {
	if p == nil {
		return nil
	}
	if shared, ok := ports.Load(*p); ok {
		return shared.(*int32)
	}
	shared, _ := ports.LoadOrStore(*p, p)
	return shared.(*int32)
}

// cacheStrings interns the strings that many cached objects repeat: node
// names, zones, namespaces, port names. Both informers' transforms use it,
// from their own goroutines.
var cacheStrings = newInterner(1 << 14)

// interner shares one copy of equal strings, and one pointer to each, up
// to limit distinct values; past that it returns its input, so that a
// cluster with an unusual variety of them costs no more than without it.
type interner struct {
	pointers sync.Map // string -> *string; read without a lock
	mu       sync.Mutex
	size     int // guarded by mu
	limit    int
}

func newInterner(limit int) *interner {
	return &interner{limit: limit}
}

// pointer returns a shared pointer to *s's value (nil for nil).
func (in *interner) pointer(s *string) *string {
	if s == nil {
		return nil
	}
	if p, ok := in.pointers.Load(*s); ok {
		return p.(*string)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.size >= in.limit {
		return s
	}
	p, loaded := in.pointers.LoadOrStore(*s, s)
	if !loaded {
		in.size++
	}
	return p.(*string)
}

// value returns the shared copy of s.
func (in *interner) value(s string) string {
	if p, ok := in.pointers.Load(s); ok {
		return *p.(*string)
	}
	c := s // only a new value's copy escapes to the heap, not every s
	return *in.pointer(&c)
}

func trimMeta(m *metav1.ObjectMeta, labels, annotations []string) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	m.Labels = keepOnly(m.Labels, labels)
	m.Annotations = keepOnly(m.Annotations, annotations)
}

// keepOnly returns the entries of m under keys, in a new map sized to
// them, or nil when there are none. A map that holds only such entries
// (the trimming decoder skipped the others) is returned as it is.
func keepOnly(m map[string]string, keys []string) map[string]string {
	kept := 0
	for _, k := range keys {
		if _, ok := m[k]; ok {
			kept++
		}
	}
	if kept == 0 {
		return nil
	}
	if kept == len(m) {
		return m
	}
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}
