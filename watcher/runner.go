package watcher

import (
	"context"
	"maps"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/metrics"
)

// SyncResult describes one sync attempt.
type SyncResult struct {
	// Full is true for a full Reconcile, false for a partial Apply.
	Full       bool
	Start, End time.Time
	// ServicePorts is how many ServicePorts were handed to the dataplane:
	// the changes for Apply (zero if nothing changed, in which case the
	// dataplane was not called), every ServicePort for Reconcile.
	ServicePorts int
	// Err is nil when the dataplane now holds the desired state.
	Err error

	// upTo is the number of changes queued before this sync read the
	// caches (see changeTracker.queuedSoFar).
	upTo uint64
}

// runner is the bounded-frequency sync loop. Changes are coalesced: a sync
// starts at most once per minSyncPeriod and takes everything queued so far.
// Every syncPeriod, and first thing after start-up, it runs a full reconcile
// instead. A failed sync is retried with exponential backoff, with its
// changes put back so that none is lost.
type runner struct {
	tracker *changeTracker
	syncer  *syncer
	metrics *metrics.Metrics
	health  HealthReporter
	// serviceHealth serves healthCheckNodePorts; may be nil.
	serviceHealth ServiceHealthReporter
	log           *zap.Logger
	now           func() time.Time

	minSyncPeriod, syncPeriod time.Duration
	retryMin, retryMax        time.Duration
	onSync                    func(SyncResult)

	// firstSync is closed after the first successful full reconcile.
	firstSync     chan struct{}
	firstSyncOnce sync.Once

	mu   sync.Mutex
	last SyncResult
}

// Retry backoff after a failed sync; the cap is lowered to syncPeriod when
// that is shorter.
const (
	defaultRetryMin = 200 * time.Millisecond
	defaultRetryMax = 10 * time.Second
)

// run syncs until ctx is done. The caller must have waited for the caches to
// be complete: the first sync is a full reconcile, and an incomplete cache
// would make it delete Services that do exist.
func (r *runner) run(ctx context.Context) {
	var (
		needFull  = true // the first sync after start-up is a full reconcile
		lastStart time.Time
		lastEnd   time.Time
		lastFull  time.Time     // start of the last successful full reconcile
		backoff   time.Duration // zero while syncs succeed
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil { // checked here too: back-to-back syncs never reach the select
		now := r.now()
		if !needFull && now.Sub(lastFull) >= r.syncPeriod {
			needFull = true
		}
		due := lastFull.Add(r.syncPeriod)
		if needFull || r.tracker.hasPending() {
			due = lastStart.Add(r.minSyncPeriod)
			if retryAt := lastEnd.Add(backoff); retryAt.After(due) {
				due = retryAt
			}
		}
		if !due.After(now) {
			res := r.syncOnce(needFull)
			lastStart, lastEnd = res.Start, res.End
			if res.Err != nil {
				backoff = r.nextBackoff(backoff)
				r.log.Error("Syncing the dataplane failed; the changes stay queued and will be retried",
					zap.Bool("full", res.Full), zap.Duration("retryIn", backoff), zap.Error(res.Err))
				continue
			}
			backoff = 0
			if needFull {
				needFull = false
				lastFull = res.Start
			}
			continue
		}
		timer.Reset(due.Sub(now))
		select {
		case <-ctx.Done():
			return
		case <-r.tracker.wake:
		case <-timer.C:
		}
	}
}

func (r *runner) nextBackoff(b time.Duration) time.Duration {
	limit := min(r.retryMax, r.syncPeriod)
	if b == 0 {
		return min(r.retryMin, limit)
	}
	return min(2*b, limit)
}

// syncOnce takes the queued changes and runs one partial or full sync.
func (r *runner) syncOnce(full bool) SyncResult {
	cs := r.tracker.take()
	res := SyncResult{Full: full, Start: r.now(), upTo: cs.upTo}
	if full {
		res.ServicePorts, res.Err = r.syncer.full()
	} else {
		res.ServicePorts, res.Err = r.syncer.partial(cs)
	}
	res.End = r.now()
	r.metrics.SyncProxyRulesDuration.Observe(res.End.Sub(res.Start).Seconds())

	r.mu.Lock()
	r.last = res
	r.mu.Unlock()
	if res.Err != nil {
		r.metrics.SyncFailuresTotal.Inc()
		r.tracker.putBack(cs)
	} else {
		r.synced(cs, res)
	}
	if r.onSync != nil {
		r.onSync(res)
	}
	return res
}

// synced publishes a successful sync to metrics and health.
func (r *runner) synced(cs changeSet, res SyncResult) {
	r.metrics.SyncProxyRulesLastTimestamp.Set(float64(res.End.UnixNano()) / 1e9)
	r.metrics.NoLocalEndpoints.WithLabelValues(metrics.TrafficPolicyInternal).Set(float64(r.syncer.noLocalTotal.internal))
	r.metrics.NoLocalEndpoints.WithLabelValues(metrics.TrafficPolicyExternal).Set(float64(r.syncer.noLocalTotal.external))
	for _, c := range cs.services {
		for _, trigger := range c.triggers {
			r.metrics.NetworkProgrammingDuration.Observe(res.End.Sub(trigger).Seconds())
		}
	}
	if r.health != nil {
		r.health.Updated()
		// Changes that arrived during the sync are still waiting.
		if r.tracker.hasPending() {
			r.health.QueuedUpdate()
		}
	}
	if r.serviceHealth != nil {
		r.serviceHealth.SyncServices(maps.Clone(r.syncer.healthChecks))
	}
	if res.Full {
		r.firstSyncOnce.Do(func() {
			r.log.Info("First full sync of the dataplane done",
				zap.Int("servicePorts", res.ServicePorts), zap.Duration("took", res.End.Sub(res.Start)))
			close(r.firstSync)
		})
	}
	r.log.Debug("Synced the dataplane", zap.Bool("full", res.Full),
		zap.Int("servicePorts", res.ServicePorts), zap.Duration("took", res.End.Sub(res.Start)))
}

// lastSync returns the result of the most recent sync attempt.
func (r *runner) lastSync() SyncResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
