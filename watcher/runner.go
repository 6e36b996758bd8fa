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
	// Held is how many ServicePorts the dataplane holds after the sync,
	// whatever this sync changed.
	Held int
	// Err is nil when the dataplane now holds the desired state.
	Err error
	// Busy is the time the sync loop spent on this sync. It is End-Start,
	// except for a periodic full reconcile, which runs in steps with
	// partial syncs in between.
	Busy time.Duration

	// upTo is the number of changes queued before this sync read the
	// caches (see changeTracker.queuedSoFar).
	upTo uint64
	// pending names the changed Services a failed sync leaves queued,
	// for its error line.
	pending []zap.Field
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

	mu      sync.Mutex
	last    SyncResult
	history syncHistory
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
//
// The periodic full reconcile does not hold up changes: when the dataplane
// can check for drift in steps (dataplane.DriftChecker), it runs as a pass
// of small steps, and a change queued meanwhile is synced before the next
// step. Only a pass that finds drift (or a dataplane that failed a call)
// falls back to the blocking full reconcile, which repairs it. The loop
// stays on one goroutine, so the syncer and the dataplane are never used
// concurrently.
func (r *runner) run(ctx context.Context) {
	var (
		needFull  = true // the first sync after start-up is a full reconcile
		lastStart time.Time
		lastEnd   time.Time
		lastFull  time.Time     // start of the last successful full reconcile
		backoff   time.Duration // zero while syncs succeed
		current   *pass         // the periodic full reconcile under way
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil { // checked here too: back-to-back syncs never reach the select
		now := r.now()
		if !needFull && current == nil && now.Sub(lastFull) >= r.syncPeriod {
			if current = r.syncer.startPass(now); current == nil {
				needFull = true // the dataplane cannot check in steps
			}
		}
		// due is when the next sync may run; without one to run, it is
		// when the next periodic reconcile begins.
		due := lastFull.Add(r.syncPeriod)
		mustSync := needFull || r.tracker.hasPending()
		if mustSync {
			due = lastStart.Add(r.minSyncPeriod)
			if retryAt := lastEnd.Add(backoff); retryAt.After(due) {
				due = retryAt
			}
		}
		if mustSync && !due.After(now) {
			res := r.syncOnce(needFull)
			lastStart, lastEnd = res.Start, res.End
			if res.Err != nil && ctx.Err() != nil {
				// SIGTERM ended the dataplane's commands (the iptables
				// modes kill a running restore): not a failure to retry.
				r.log.Info("Stopped in the middle of a sync: the dataplane holds what its last completed write left, which the next kpr's first full sync completes",
					append(res.pending, zap.Bool("full", res.Full), zap.Error(res.Err))...)
				return
			}
			if res.Err != nil {
				backoff = r.nextBackoff(backoff)
				r.log.Error("Syncing the dataplane failed; the changes stay queued and will be retried (kpr status shows recent failures)",
					append(res.pending, zap.Bool("full", res.Full), zap.Duration("retryIn", backoff), zap.Error(res.Err))...)
				continue
			}
			backoff = 0
			if needFull {
				needFull = false
				lastFull = res.Start
			}
			continue
		}
		if current != nil {
			switch res, done := r.passStep(current); {
			case !done:
			case res.Err != nil:
				current = nil
				needFull = true
				lastEnd = res.End
				backoff = r.nextBackoff(backoff)
				r.log.Error("The periodic full reconcile failed; running a complete one instead",
					zap.Duration("retryIn", backoff), zap.Error(res.Err))
			case res.Full:
				current = nil
				lastFull = res.Start
			default: // the dataplane cannot vouch for its state
				current = nil
				needFull = true
				r.log.Info("The dataplane drifted from what kpr wrote (or a call failed); running a complete reconcile to repair it")
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

// passStep runs one step of a periodic full reconcile. When the pass is
// done it returns its result: Full if it completed and the dataplane holds
// the desired state, Err if a step failed, neither if a blocking full
// reconcile must follow.
func (r *runner) passStep(p *pass) (SyncResult, bool) {
	start := r.now()
	done, held, err := r.syncer.step(p)
	end := r.now()
	p.busy += end.Sub(start)
	p.longest = max(p.longest, end.Sub(start))
	p.steps++
	if !done {
		return SyncResult{}, false
	}
	res := SyncResult{Full: held && err == nil, Start: p.start, End: end, ServicePorts: p.ports, Held: r.syncer.heldPorts, Busy: p.busy, Err: err}
	if err != nil {
		r.metrics.SyncFailuresTotal.Inc()
	}
	if res.Full || err != nil {
		r.metrics.ObserveSync(true, p.busy)
		r.mu.Lock()
		r.last = res
		r.history.record(res)
		r.mu.Unlock()
	}
	if res.Full {
		r.log.Debug("Periodic full reconcile done in steps", zap.Int("steps", p.steps),
			zap.Duration("longestStep", p.longest), zap.Duration("busy", p.busy))
		r.synced(changeSet{}, res, p.written)
	}
	if (res.Full || err != nil) && r.onSync != nil {
		r.onSync(res)
	}
	return res, true
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
	res.Busy = res.End.Sub(res.Start)
	res.Held = r.syncer.heldPorts
	written := r.syncer.takeWritten()
	r.metrics.ObserveSync(full, res.Busy)

	r.mu.Lock()
	r.last = res
	r.history.record(res)
	r.mu.Unlock()
	if res.Err != nil {
		r.metrics.SyncFailuresTotal.Inc()
		res.pending = changedServices(cs).nameFields()
		r.tracker.putBack(cs)
	} else {
		r.synced(cs, res, written)
	}
	if r.onSync != nil {
		r.onSync(res)
	}
	return res
}

// synced publishes a successful sync to metrics, health and the log,
// where one info line sums up what it wrote (w).
func (r *runner) synced(cs changeSet, res SyncResult, w writeSummary) {
	r.metrics.SetLastSync(res.End)
	for i, fam := range metrics.Families {
		r.metrics.NoLocalEndpoints.WithLabelValues(metrics.TrafficPolicyInternal, fam).Set(float64(r.syncer.noLocalTotal[i].internal))
		r.metrics.NoLocalEndpoints.WithLabelValues(metrics.TrafficPolicyExternal, fam).Set(float64(r.syncer.noLocalTotal[i].external))
	}
	for _, c := range cs.services {
		for _, trigger := range c.triggers {
			r.metrics.NetworkProgrammingDuration.WithLabelValues(trigger.family).Observe(res.End.Sub(trigger.at).Seconds())
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
	r.log.Info("Synced the dataplane", append(w.fields(), zap.Bool("full", res.Full),
		zap.Duration("took", res.End.Sub(res.Start)), zap.Duration("busy", res.Busy))...)
}

// lastSync returns the result of the most recent sync attempt.
func (r *runner) lastSync() SyncResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
