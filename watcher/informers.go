package watcher

import (
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/desired"
)

// apiObjects owns the informers and implements objectSource on their caches.
type apiObjects struct {
	// informers are the Service, EndpointSlice and Node (this node only)
	// informers; running counts their goroutines.
	informers []cache.SharedIndexInformer
	running   sync.WaitGroup
	services  corelisters.ServiceLister
	slices    *sliceIndex
	synced    []cache.InformerSynced
	// conn follows the connection to the API server, for Status.
	conn *connState
}

// sliceIndex finds the EndpointSlices of a Service without a scan. The
// slice handler keeps it, instead of an indexer on the informer's store:
// client-go's index keeps a set (a Go map) per Service, which at 10,000
// Services of one slice each costs several MiB for one key per set.
type sliceIndex struct {
	mu     sync.RWMutex
	byName map[serviceName][]*discoveryv1.EndpointSlice // slices sorted by name
}

func newSliceIndex() *sliceIndex {
	return &sliceIndex{byName: map[serviceName][]*discoveryv1.EndpointSlice{}}
}

// slices returns a copy of the Service's slices.
func (x *sliceIndex) slices(key serviceName) []*discoveryv1.EndpointSlice {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return slices.Clone(x.byName[key])
}

// update records that old (nil for an add) is now cur (nil for a delete).
// Either may have no Service label; a label edit moves the slice.
func (x *sliceIndex) update(old, cur *discoveryv1.EndpointSlice) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if key, ok := desired.SliceServiceName(old); ok {
		x.remove(key, old.Name)
	}
	if key, ok := desired.SliceServiceName(cur); ok {
		x.remove(key, cur.Name)
		list := x.byName[key]
		i, _ := slices.BinarySearchFunc(list, cur.Name, func(s *discoveryv1.EndpointSlice, name string) int {
			return strings.Compare(s.Name, name)
		})
		x.byName[key] = slices.Insert(list, i, cur)
	}
}

func (x *sliceIndex) remove(key serviceName, name string) {
	list := x.byName[key]
	i := slices.IndexFunc(list, func(s *discoveryv1.EndpointSlice) bool { return s.Name == name })
	switch {
	case i < 0:
	case len(list) == 1:
		delete(x.byName, key)
	default:
		x.byName[key] = slices.Delete(list, i, i+1)
	}
}

// proxiedSelector is kube-proxy's selector for both Services and
// EndpointSlices: leave out what another proxy owns and what is headless.
// (The EndpointSlice controller copies Service labels onto slices, so the
// same selector works for both.)
func proxiedSelector() string {
	noProxyName, err := labels.NewRequirement(desired.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // constant input
	}
	notHeadless, err := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // constant input
	}
	return labels.NewSelector().Add(*noProxyName, *notHeadless).String()
}

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

// newAPIObjects creates (but does not start) the informers and connects
// their events to the tracker and the node tracker. Events of slices whose
// last-change-trigger-time is before started are not timed.
func newAPIObjects(client *apiclient.Clients, nodeName string, tracker *changeTracker, node *nodeTracker, started time.Time, log *zap.Logger) (*apiObjects, error) {
	// Decoding skips what the transform would drop anyway (most of an
	// object as Helm and kubectl write it), instead of allocating it
	// first: the garbage of the initial lists.
	client, err := client.Trimmed(apiclient.Trim{
		ServiceLabels: serviceLabels, SliceLabels: sliceLabels, SliceAnnotations: sliceAnnotations,
	})
	if err != nil {
		return nil, err
	}
	// No informer resync (0): the periodic full reconcile covers drift,
	// and a resync would mark every Service dirty for nothing.
	selector := proxiedSelector()
	proxied := func(o *metav1.ListOptions) { o.LabelSelector = selector }
	conn := newConnState(time.Now)
	// No namespace index: the syncer gets Services by key and lists them
	// all, and the index keeps a set of keys per namespace, 10,000 keys
	// at 10,000 Services.
	svcInformer := cache.NewSharedIndexInformer(
		conn.follow(cache.NewFilteredListWatchFromClient(client.Core, "services", metav1.NamespaceAll, proxied)),
		&v1.Service{}, 0, cache.Indexers{})
	sliceInformer := cache.NewSharedIndexInformer(
		conn.follow(cache.NewFilteredListWatchFromClient(client.Discovery, "endpointslices", metav1.NamespaceAll, proxied)),
		&discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
	nodeInformer := cache.NewSharedIndexInformer(
		conn.follow(cache.NewFilteredListWatchFromClient(client.Core, "nodes", metav1.NamespaceAll, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		})),
		&v1.Node{}, 0, cache.Indexers{})
	transform := cacheTransform(started)
	for _, t := range []struct {
		informer  cache.SharedIndexInformer
		transform cache.TransformFunc
	}{{svcInformer, transform}, {sliceInformer, transform}, {nodeInformer, stripManagedFields}} {
		if err := t.informer.SetTransform(t.transform); err != nil {
			return nil, err
		}
	}

	a := &apiObjects{
		informers: []cache.SharedIndexInformer{svcInformer, sliceInformer, nodeInformer},
		services:  corelisters.NewServiceLister(svcInformer.GetIndexer()),
		slices:    newSliceIndex(),
		conn:      conn,
	}

	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{svcInformer, serviceHandler(tracker)},
		{sliceInformer, sliceHandler(a.slices, tracker, started, log)},
		{nodeInformer, nodeHandler(tracker, node)},
	}
	for _, h := range handlers {
		reg, err := h.informer.AddEventHandler(a.conn.observed(h.handler))
		if err != nil {
			return nil, err
		}
		// Synced once the handler has seen the initial list, not merely
		// once the store has it.
		a.synced = append(a.synced, reg.HasSynced)
	}
	return a, nil
}

// start runs the informers, each in its own goroutine, until stop is closed.
func (a *apiObjects) start(stop <-chan struct{}) {
	for _, informer := range a.informers {
		a.running.Go(func() { informer.Run(stop) })
	}
}

// shutdown waits for the informer goroutines after their stop channel closed.
func (a *apiObjects) shutdown() {
	a.running.Wait()
}

// Service implements objectSource.
func (a *apiObjects) Service(key serviceName) (*v1.Service, bool) {
	svc, err := a.services.Services(key.Namespace).Get(key.Name)
	return svc, err == nil
}

// Slices implements objectSource.
func (a *apiObjects) Slices(key serviceName) []*discoveryv1.EndpointSlice {
	return a.slices.slices(key)
}

// ServiceNames implements objectSource.
func (a *apiObjects) ServiceNames() []serviceName {
	svcs, _ := a.services.List(labels.Everything()) // a cache list cannot fail
	keys := make([]serviceName, len(svcs))
	for i, svc := range svcs {
		keys[i] = serviceName{Namespace: svc.Namespace, Name: svc.Name}
	}
	return keys
}

// tombstone unwraps the object of a delete event whose final state the
// informer missed.
func tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func serviceHandler(tracker *changeTracker) cache.ResourceEventHandler {
	changed := func(obj any) {
		if svc, ok := tombstone(obj).(*v1.Service); ok {
			tracker.serviceChanged(serviceName{Namespace: svc.Namespace, Name: svc.Name})
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: changed,
	}
}

// sliceHandler keeps index current and tells tracker, in that order, so
// that a sync the tracker starts finds the slice in the index.
func sliceHandler(index *sliceIndex, tracker *changeTracker, started time.Time, log *zap.Logger) cache.ResourceEventHandler {
	changed := func(old, cur *discoveryv1.EndpointSlice) {
		index.update(old, cur)
		key, ok := desired.SliceServiceName(cur)
		// A slice moved to another Service or out of every Service (label
		// edit) leaves the old Service changed too.
		if oldKey, oldOK := desired.SliceServiceName(old); oldOK && (!ok || oldKey != key) {
			tracker.endpointsChanged(oldKey, time.Time{})
		}
		if !ok {
			return
		}
		trigger := triggerTime(cur, log)
		if !trigger.After(started) || (old != nil && triggerTime(old, log).Equal(trigger)) {
			// Older than kpr, or an update that is not a new endpoint
			// change (e.g. a label edit): nothing to time.
			trigger = time.Time{}
		}
		tracker.endpointsChanged(key, trigger)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if slice, ok := obj.(*discoveryv1.EndpointSlice); ok {
				changed(nil, slice)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, _ := oldObj.(*discoveryv1.EndpointSlice)
			if slice, ok := obj.(*discoveryv1.EndpointSlice); ok {
				changed(old, slice)
			}
		},
		DeleteFunc: func(obj any) {
			if slice, ok := tombstone(obj).(*discoveryv1.EndpointSlice); ok {
				index.update(slice, nil)
				if key, ok := desired.SliceServiceName(slice); ok {
					tracker.endpointsChanged(key, time.Time{})
				}
			}
		},
	}
}

// triggerTime reads the EndpointSlice controller's last-change-trigger-time
// annotation; zero if absent or malformed.
func triggerTime(slice *discoveryv1.EndpointSlice, log *zap.Logger) time.Time {
	value, ok := slice.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, value)
	if err != nil {
		log.Debug("Ignoring malformed trigger time annotation", zap.String("slice", slice.Namespace+"/"+slice.Name),
			zap.String("value", value), zap.Error(err))
		return time.Time{}
	}
	return t
}

func nodeHandler(tracker *changeTracker, node *nodeTracker) cache.ResourceEventHandler {
	changed := func(obj any) {
		if n, ok := obj.(*v1.Node); ok && node.update(n) {
			tracker.allChanged()
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: func(any) { node.deleted() },
	}
}
