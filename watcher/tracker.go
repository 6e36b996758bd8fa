package watcher

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kpr-io/kpr/metrics"
)

// serviceName names a Service; slices join it through their service-name label.
type serviceName = types.NamespacedName

// changeKind says what kind of object changed for a Service, for the
// separate service/endpoint "pending" metrics.
type changeKind uint8

const (
	serviceChange changeKind = 1 << iota
	endpointsChange
)

// pendingChange is what is known about one dirty Service.
type pendingChange struct {
	kinds changeKind
	// triggers are last-change-trigger-time annotations of slice events
	// newer than kpr's start, observed as network programming latency once
	// the change is in the dataplane.
	triggers []trigger
}

// trigger is one slice's last-change-trigger-time and its address
// family, the ip_family its network programming latency is counted in.
type trigger struct {
	at     time.Time
	family string
}

// changeSet is a batch of dirty Services taken out of the tracker for one sync.
type changeSet struct {
	services map[serviceName]*pendingChange
	// all is set when every Service must be recomputed (the node changed).
	all bool
	// upTo is the number of changes ever queued when the set was taken:
	// a sync of this set has seen every change up to that one.
	upTo uint64
	// serviceChanges and endpointChanges count the Services in services
	// with that kind of change, for the *_changes_pending gauges.
	serviceChanges, endpointChanges int
}

// changeTracker collects change notifications from informer handlers and
// hands them to the sync loop in batches. Marking a Service dirty twice
// before a sync costs nothing extra: that is the coalescing.
type changeTracker struct {
	metrics *metrics.Metrics
	health  HealthReporter
	now     func() time.Time

	// wake has room for one signal: a signal already waiting means the loop
	// will look at the tracker anyway, so more signals are dropped.
	wake chan struct{}

	mu      sync.Mutex
	pending changeSet
	// queuedTotal counts every change ever queued.
	queuedTotal uint64
}

func newChangeTracker(m *metrics.Metrics, health HealthReporter, now func() time.Time) *changeTracker {
	return &changeTracker{
		metrics: m,
		health:  health,
		now:     now,
		wake:    make(chan struct{}, 1),
		pending: newChangeSet(),
	}
}

// serviceChanged records an add, update or delete of a Service.
func (t *changeTracker) serviceChanged(key serviceName) {
	t.metrics.ServiceChangesTotal.Inc()
	t.mu.Lock()
	t.pending.add(key, serviceChange, nil)
	t.queuedTotal++
	t.updatePendingGauges()
	t.mu.Unlock()
	t.queued()
}

// endpointsChanged records an EndpointSlice event for the Service key.
// at is the slice's last-change-trigger-time, zero if unknown or older
// than kpr itself; family is the slice's address type.
func (t *changeTracker) endpointsChanged(key serviceName, at time.Time, family string) {
	t.metrics.EndpointChangesTotal.Inc()
	var triggers []trigger
	if !at.IsZero() {
		triggers = []trigger{{at: at, family: family}}
	}
	t.mu.Lock()
	t.pending.add(key, endpointsChange, triggers)
	t.queuedTotal++
	t.updatePendingGauges()
	t.mu.Unlock()
	t.queued()
}

// allChanged records that every Service must be recomputed.
func (t *changeTracker) allChanged() {
	t.mu.Lock()
	t.pending.all = true
	t.queuedTotal++
	t.mu.Unlock()
	t.queued()
}

// queued tells the metrics, the health server and the sync loop that work
// is waiting.
func (t *changeTracker) queued() {
	t.metrics.SetLastQueued(t.now())
	if t.health != nil {
		t.health.QueuedUpdate()
	}
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// queuedSoFar returns how many changes have been queued so far; compare
// with SyncResult.upTo to learn whether a sync has seen them.
func (t *changeTracker) queuedSoFar() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.queuedTotal
}

// hasPending reports whether a sync has work to do.
func (t *changeTracker) hasPending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending.all || len(t.pending.services) > 0
}

// take removes and returns everything pending. Changes that arrive while
// the caller syncs start a new batch.
func (t *changeTracker) take() changeSet {
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := t.pending
	cs.upTo = t.queuedTotal
	t.pending = newChangeSet()
	t.updatePendingGauges()
	return cs
}

// putBack returns a batch whose sync failed, merged with whatever arrived
// meanwhile, so that no change is lost before it reaches the dataplane.
func (t *changeTracker) putBack(cs changeSet) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending.all = t.pending.all || cs.all
	for key, c := range cs.services {
		t.pending.add(key, c.kinds, c.triggers)
	}
	t.updatePendingGauges()
}

// updatePendingGauges must be called with t.mu held.
func (t *changeTracker) updatePendingGauges() {
	t.metrics.ServiceChangesPending.Set(float64(t.pending.serviceChanges))
	t.metrics.EndpointChangesPending.Set(float64(t.pending.endpointChanges))
}

func newChangeSet() changeSet {
	return changeSet{services: map[serviceName]*pendingChange{}}
}

// add merges one change into the set, keeping the per-kind counts current
// without walking the whole set (a storm of events must stay O(1) each).
func (cs *changeSet) add(key serviceName, kinds changeKind, triggers []trigger) {
	e, ok := cs.services[key]
	if !ok {
		e = &pendingChange{}
		cs.services[key] = e
	}
	added := kinds &^ e.kinds
	if added&serviceChange != 0 {
		cs.serviceChanges++
	}
	if added&endpointsChange != 0 {
		cs.endpointChanges++
	}
	e.kinds |= kinds
	e.triggers = append(e.triggers, triggers...)
}
