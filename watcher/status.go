package watcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Status is the watcher's part of `kpr status`: how current the dataplane
// is and whether the API feeds it.
type Status struct {
	// LastSuccessfulSync is nil before the first sync succeeded.
	LastSuccessfulSync *SyncStatus `json:"lastSuccessfulSync,omitempty"`
	// LastSuccessfulFullSync is the last complete reconcile, which also
	// repairs drift in the dataplane.
	LastSuccessfulFullSync *SyncStatus `json:"lastSuccessfulFullSync,omitempty"`
	// RecentFailures are the last failed syncs, newest last.
	RecentFailures []SyncStatus `json:"recentFailures"`
	// Pending changes not in the dataplane yet, as the *_changes_pending
	// gauges count them; AllPending when every Service waits (node change).
	PendingServiceChanges  int       `json:"pendingServiceChanges"`
	PendingEndpointChanges int       `json:"pendingEndpointChanges"`
	AllPending             bool      `json:"allPending,omitempty"`
	API                    APIStatus `json:"api"`
}

// SyncStatus is one sync attempt.
type SyncStatus struct {
	At           time.Time     `json:"at"` // when it ended
	Took         time.Duration `json:"tookNanoseconds"`
	Full         bool          `json:"full"`
	ServicePorts int           `json:"servicePorts"`
	// HeldServicePorts is how many ServicePorts the dataplane holds after
	// the sync: a periodic reconcile that found nothing to change writes
	// none and still serves them all.
	HeldServicePorts int    `json:"heldServicePorts"`
	Error            string `json:"error,omitempty"`
}

// APIStatus is the state of the connection to the API server, as the
// informers' list and watch calls see it: a call that failed, or a list or
// watch call that has waited for the API server longer than apiWaitLimit
// (kpr's client holds calls through a short outage, see apiclient), makes
// it disconnected until a call succeeds again.
type APIStatus struct {
	Connected bool `json:"connected"`
	// DisconnectedSince is the start of the current outage.
	DisconnectedSince *time.Time `json:"disconnectedSince,omitempty"`
	LastError         string     `json:"lastError,omitempty"`
	LastErrorAt       *time.Time `json:"lastErrorAt,omitempty"`
	// LastEvent is when an informer last delivered an object.
	LastEvent *time.Time `json:"lastEvent,omitempty"`
	// LastHeard is when the API server last sent kpr anything: a list, a
	// watch opened, or an event or bookmark on a watch. It advances in a
	// quiet cluster too: the API server sends every watch a bookmark
	// about once a minute, and client-go renews each watch within 5 to
	// 10 minutes.
	LastHeard *time.Time `json:"lastHeard,omitempty"`
	// Stuck is set while no call fails or waits and yet nothing was
	// heard for watchSilenceLimit: the watches are open but deliver
	// nothing, so changes in the API do not reach the dataplane.
	Stuck bool `json:"stuck,omitempty"`
}

// apiWaitLimit is how long a list or watch call may wait for its response
// before Status counts the API server as unreachable. A watch answers as
// soon as the server accepts it, in milliseconds; a list starts answering
// within seconds even in a large cluster.
const apiWaitLimit = 3 * time.Second

// watchSilenceLimit is how long the watches may deliver nothing at all,
// not even a bookmark, before Status calls them stuck: three of the API
// server's once-a-minute bookmarks missed.
const watchSilenceLimit = 3 * time.Minute

// recentFailures is how many failed syncs Status keeps.
const recentFailures = 5

// Status returns the watcher's current status; safe to call from any
// goroutine.
func (w *Watcher) Status() Status {
	st := w.runner.status()
	st.API = w.api.conn.status()
	w.runner.tracker.mu.Lock()
	p := w.runner.tracker.pending
	st.PendingServiceChanges, st.PendingEndpointChanges, st.AllPending = p.serviceChanges, p.endpointChanges, p.all
	w.runner.tracker.mu.Unlock()
	return st
}

// syncHistory keeps what Status reports about syncs; runner.mu guards it.
type syncHistory struct {
	ok, okFull *SyncStatus
	failures   []SyncStatus
}

// record notes one sync attempt that ended (a pass counts when it ends).
func (h *syncHistory) record(res SyncResult) {
	s := SyncStatus{At: res.End, Took: res.Busy, Full: res.Full, ServicePorts: res.ServicePorts, HeldServicePorts: res.Held}
	if res.Err != nil {
		s.Error = res.Err.Error()
		h.failures = append(h.failures, s)
		if len(h.failures) > recentFailures {
			h.failures = h.failures[1:]
		}
		return
	}
	h.ok = &s
	if res.Full {
		h.okFull = &s
	}
}

func (r *runner) status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{RecentFailures: append([]SyncStatus{}, r.history.failures...)}
	if r.history.ok != nil {
		ok := *r.history.ok
		st.LastSuccessfulSync = &ok
	}
	if r.history.okFull != nil {
		ok := *r.history.okFull
		st.LastSuccessfulFullSync = &ok
	}
	return st
}

// connState follows the informers' list and watch calls and events.
type connState struct {
	now func() time.Time

	mu        sync.Mutex
	lastError string
	// lastErrorAt is the last failed call, failingSince the first of the
	// current outage (zero while calls succeed).
	lastErrorAt, failingSince time.Time
	lastEvent                 time.Time
	// lastHeard is the last answer of a call or item on a watch.
	lastHeard time.Time
	// waiting holds the start of every list and watch call under way.
	waiting map[uint64]time.Time
	nextID  uint64
}

func newConnState(now func() time.Time) *connState {
	return &connState{now: now, waiting: map[uint64]time.Time{}}
}

// follow makes lw report its calls to c, and returns it. It changes the
// functions in place, so that whatever else client-go knows about lw
// still holds.
func (c *connState) follow(lw *cache.ListWatch) *cache.ListWatch {
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		id := c.start()
		obj, err := list(ctx, o)
		c.finish(id)
		c.done(err)
		return obj, err
	}
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		id := c.start()
		w, err := watchFn(ctx, o)
		c.finish(id)
		c.done(err)
		if err != nil {
			return w, err
		}
		// Every item the API server sent counts, bookmarks too: they are
		// how a quiet but healthy watch shows it is alive. An Error item
		// may be the client's own (a connection it gave up).
		return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if e.Type != watch.Error {
				c.heard()
			}
			return e, true
		}), nil
	}
	lw.ListFunc = func(o metav1.ListOptions) (runtime.Object, error) {
		return lw.ListWithContextFunc(context.Background(), o)
	}
	lw.WatchFunc = func(o metav1.ListOptions) (watch.Interface, error) {
		return lw.WatchFuncWithContext(context.Background(), o)
	}
	return lw
}

func (c *connState) start() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	c.waiting[c.nextID] = c.now()
	return c.nextID
}

func (c *connState) finish(id uint64) {
	c.mu.Lock()
	delete(c.waiting, id)
	c.mu.Unlock()
}

// done records the outcome of a list or watch call. A canceled call (kpr
// stopping) says nothing about the API server.
func (c *connState) done(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if err == nil {
		c.failingSince = time.Time{}
		c.lastHeard = now
		return
	}
	if c.failingSince.IsZero() {
		c.failingSince = now
	}
	c.lastError, c.lastErrorAt = err.Error(), now
}

// heard records an item a watch delivered.
func (c *connState) heard() {
	c.mu.Lock()
	c.lastHeard = c.now()
	c.mu.Unlock()
}

// event records that an informer delivered an object.
func (c *connState) event() {
	c.mu.Lock()
	c.lastEvent = c.now()
	c.mu.Unlock()
}

func (c *connState) status() APIStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	since := c.failingSince
	for _, started := range c.waiting {
		if now.Sub(started) >= apiWaitLimit && (since.IsZero() || started.Before(since)) {
			since = started
		}
	}
	st := APIStatus{Connected: since.IsZero(), LastError: c.lastError}
	if !since.IsZero() {
		st.DisconnectedSince = &since
		if c.failingSince.IsZero() || since.Before(c.failingSince) {
			st.LastError = fmt.Sprintf("a list or watch call has waited for the API server for %s", now.Sub(since).Round(time.Second))
		}
	}
	if !c.lastHeard.IsZero() {
		heard := c.lastHeard
		st.LastHeard = &heard
		st.Stuck = st.Connected && now.Sub(heard) > watchSilenceLimit
	}
	if !c.lastErrorAt.IsZero() {
		at := c.lastErrorAt
		st.LastErrorAt = &at
	}
	if !c.lastEvent.IsZero() {
		ev := c.lastEvent
		st.LastEvent = &ev
	}
	return st
}

// observed wraps h so that every event it gets is recorded in c.
func (c *connState) observed(h cache.ResourceEventHandler) cache.ResourceEventHandler {
	return observedHandler{c: c, next: h}
}

type observedHandler struct {
	c    *connState
	next cache.ResourceEventHandler
}

func (o observedHandler) OnAdd(obj any, initial bool) { o.c.event(); o.next.OnAdd(obj, initial) }
func (o observedHandler) OnUpdate(old, cur any)       { o.c.event(); o.next.OnUpdate(old, cur) }
func (o observedHandler) OnDelete(obj any)            { o.c.event(); o.next.OnDelete(obj) }
