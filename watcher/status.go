package watcher

import (
	"context"
	"sync"
	"time"

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
	Error        string        `json:"error,omitempty"`
}

// APIStatus is the state of the connection to the API server, as the
// informers see it: a list or watch that failed makes it disconnected
// until an event arrives again. A re-list after an error delivers every
// object again (at least this node's Node), so a working connection shows
// as connected within one list.
type APIStatus struct {
	Connected bool `json:"connected"`
	// DisconnectedSince is the first failure of the current outage.
	DisconnectedSince *time.Time `json:"disconnectedSince,omitempty"`
	LastError         string     `json:"lastError,omitempty"`
	LastErrorAt       *time.Time `json:"lastErrorAt,omitempty"`
	// LastEvent is when an informer last delivered an object. The API
	// may be reachable and still send nothing (a stuck watch): a
	// LastEvent far behind while Services change is how that shows.
	LastEvent *time.Time `json:"lastEvent,omitempty"`
}

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
	s := SyncStatus{At: res.End, Took: res.Busy, Full: res.Full, ServicePorts: res.ServicePorts}
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

// connState follows the informers' list and watch errors and events.
type connState struct {
	now func() time.Time

	mu                 sync.Mutex
	lastError          string
	lastErrorAt, since time.Time // since: first error of the current outage
	lastEvent          time.Time
}

// watchError is every informer's WatchErrorHandler: it records the
// failure and then logs it as client-go would by default.
func (c *connState) watchError(ctx context.Context, r *cache.Reflector, err error) {
	c.mu.Lock()
	now := c.now()
	if c.since.IsZero() {
		c.since = now
	}
	c.lastError, c.lastErrorAt = err.Error(), now
	c.mu.Unlock()
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// event records that an informer delivered an object: the API is there.
func (c *connState) event() {
	c.mu.Lock()
	c.lastEvent = c.now()
	c.since = time.Time{}
	c.mu.Unlock()
}

func (c *connState) status() APIStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := APIStatus{Connected: c.since.IsZero(), LastError: c.lastError}
	if !c.since.IsZero() {
		since := c.since
		st.DisconnectedSince = &since
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
