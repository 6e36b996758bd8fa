package watcher

import (
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kpr-io/kpr/desired"
)

// sliceByService indexes EndpointSlices by the namespace/name of their
// Service, so that a sync finds all slices of a Service without a scan.
const sliceByService = "service"

// apiObjects owns the informers and implements objectSource on their caches.
type apiObjects struct {
	factory     informers.SharedInformerFactory // Services and EndpointSlices
	nodeFactory informers.SharedInformerFactory // this node only
	services    corelisters.ServiceLister
	slices      cache.Indexer
	synced      []cache.InformerSynced
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

// lastAppliedAnnotation is kubectl's copy of the whole object as applied:
// often the largest field of a Service, and never read by kpr.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// stripManagedFields drops what kpr never reads from every cached object:
// managed fields, kubectl's last-applied copy, and per endpoint the pod
// reference and hostname. On a node with 10,000 Services those are a large
// part of kpr's memory.
func stripManagedFields(obj any) (any, error) {
	if accessor, err := meta.Accessor(obj); err == nil {
		accessor.SetManagedFields(nil)
		if a := accessor.GetAnnotations(); a[lastAppliedAnnotation] != "" {
			delete(a, lastAppliedAnnotation)
		}
	}
	if slice, ok := obj.(*discoveryv1.EndpointSlice); ok {
		for i := range slice.Endpoints {
			slice.Endpoints[i].TargetRef = nil
			slice.Endpoints[i].Hostname = nil
			slice.Endpoints[i].DeprecatedTopology = nil
		}
	}
	return obj, nil
}

// newAPIObjects creates (but does not start) the informers and connects
// their events to the tracker and the node tracker. Events of slices whose
// last-change-trigger-time is before started are not timed.
func newAPIObjects(client kubernetes.Interface, nodeName string, tracker *changeTracker, node *nodeTracker, started time.Time, log *zap.Logger) (*apiObjects, error) {
	// No informer resync: the periodic full reconcile covers drift, and a
	// resync would mark every Service dirty for nothing.
	selector := proxiedSelector()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))

	svcInformer := factory.Core().V1().Services()
	sliceInformer := factory.Discovery().V1().EndpointSlices()
	nodeInformer := nodeFactory.Core().V1().Nodes()

	if err := sliceInformer.Informer().AddIndexers(cache.Indexers{sliceByService: indexSliceByService}); err != nil {
		return nil, err
	}
	a := &apiObjects{
		factory:     factory,
		nodeFactory: nodeFactory,
		services:    svcInformer.Lister(),
		slices:      sliceInformer.Informer().GetIndexer(),
	}

	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{svcInformer.Informer(), serviceHandler(tracker)},
		{sliceInformer.Informer(), sliceHandler(tracker, started, log)},
		{nodeInformer.Informer(), nodeHandler(tracker, node)},
	}
	for _, h := range handlers {
		reg, err := h.informer.AddEventHandler(h.handler)
		if err != nil {
			return nil, err
		}
		// Synced once the handler has seen the initial list, not merely
		// once the store has it.
		a.synced = append(a.synced, reg.HasSynced)
	}
	return a, nil
}

func indexSliceByService(obj any) ([]string, error) {
	slice, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	key, ok := desired.ServiceKey(slice)
	if !ok {
		return nil, nil
	}
	return []string{key.String()}, nil
}

// start runs the informers until stop is closed.
func (a *apiObjects) start(stop <-chan struct{}) {
	a.factory.Start(stop)
	a.nodeFactory.Start(stop)
}

// shutdown waits for the informer goroutines after their stop channel closed.
func (a *apiObjects) shutdown() {
	a.factory.Shutdown()
	a.nodeFactory.Shutdown()
}

// Service implements objectSource.
func (a *apiObjects) Service(key serviceKey) (*v1.Service, bool) {
	svc, err := a.services.Services(key.Namespace).Get(key.Name)
	return svc, err == nil
}

// Slices implements objectSource.
func (a *apiObjects) Slices(key serviceKey) []*discoveryv1.EndpointSlice {
	objs, err := a.slices.ByIndex(sliceByService, key.String())
	if err != nil {
		return nil // only fails for an unknown index name, which is a constant
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, obj := range objs {
		if slice, ok := obj.(*discoveryv1.EndpointSlice); ok {
			out = append(out, slice)
		}
	}
	return out
}

// ServiceKeys implements objectSource.
func (a *apiObjects) ServiceKeys() []serviceKey {
	svcs, _ := a.services.List(labels.Everything()) // a cache list cannot fail
	keys := make([]serviceKey, len(svcs))
	for i, svc := range svcs {
		keys[i] = serviceKey{Namespace: svc.Namespace, Name: svc.Name}
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
			tracker.serviceChanged(serviceKey{Namespace: svc.Namespace, Name: svc.Name})
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: changed,
	}
}

func sliceHandler(tracker *changeTracker, started time.Time, log *zap.Logger) cache.ResourceEventHandler {
	changed := func(old, cur *discoveryv1.EndpointSlice) {
		key, ok := desired.ServiceKey(cur)
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
		// A slice moved to another Service (label edit) leaves the old
		// Service changed too.
		if oldKey, ok := desired.ServiceKey(old); ok && oldKey != key {
			tracker.endpointsChanged(oldKey, time.Time{})
		}
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
				if key, ok := desired.ServiceKey(slice); ok {
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
