package watcher

import (
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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
			tracker.endpointsChanged(oldKey, time.Time{}, "")
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
		tracker.endpointsChanged(key, trigger, string(cur.AddressType))
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
					tracker.endpointsChanged(key, time.Time{}, "")
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
