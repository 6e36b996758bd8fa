package watcher

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/health"
	"github.com/kpr-io/kpr/metrics"
)

// Defaults for Config.
const (
	// DefaultSyncPeriod is kube-proxy's default --iptables-sync-period.
	DefaultSyncPeriod = 30 * time.Second
	// DefaultMinSyncPeriod is zero: sync as soon as possible, coalescing
	// whatever queues up while a sync runs. Map updates are cheap enough
	// that kube-proxy's 1 s pacing would only add latency.
	DefaultMinSyncPeriod = 0
)

// ServiceHealthReporter serves the healthCheckNodePorts of
// externalTrafficPolicy: Local Services; *health.ServiceServer implements it.
type ServiceHealthReporter interface {
	SyncServices(map[types.NamespacedName]health.Service)
}

// HealthReporter is what the watcher tells the health endpoints;
// *health.ProxyServer implements it.
type HealthReporter interface {
	// QueuedUpdate: a change arrived that is not in the dataplane yet.
	QueuedUpdate()
	// Updated: a sync succeeded; everything queued before it is programmed.
	Updated()
	// SetNode: the latest Node object of this node, nil once it is deleted.
	SetNode(node *v1.Node)
}

// Config configures a Watcher.
type Config struct {
	// NodeName is this node's name; it selects the Node object watched for
	// the zone label, the NodePort addresses and eligibility. Required.
	NodeName string
	// NodePortAddresses selects the addresses NodePorts are served on
	// (--nodeport-addresses); the zero value means every InternalIP and
	// ExternalIP of the Node, and loopback.
	NodePortAddresses desired.NodePortAddresses
	// ExternalIPs says which Service externalIPs are programmed
	// (--external-ips); the zero value is all of them.
	ExternalIPs desired.ExternalIPPolicy
	// MinSyncPeriod is the least time between the starts of two syncs;
	// zero (DefaultMinSyncPeriod) syncs as soon as changes are queued.
	MinSyncPeriod time.Duration
	// SyncPeriod is the longest time between two full reconciles; zero
	// means DefaultSyncPeriod.
	SyncPeriod time.Duration
	// Metrics receives kube-proxy's sync metrics; nil means a private set
	// nobody scrapes.
	Metrics *metrics.Metrics
	// Health, if set, is told about queued changes, syncs and the Node.
	Health HealthReporter
	// ServiceHealth, if set, gets the healthCheckNodePort state of every
	// externalTrafficPolicy: Local Service after each successful sync.
	ServiceHealth ServiceHealthReporter
	// Events, if set, receives a Warning Event on every Service with a port
	// the dataplane refuses (see dataplane.Refuser), and a Normal one when
	// the port is programmed after all.
	Events EventRecorder
	// NodeIPs, if set, is called with the Node object's InternalIP and
	// ExternalIP addresses (desired.NodeIPs) when they first arrive and
	// whenever they change, from an informer's goroutine: keep it quick.
	// The eBPF backend's device detection takes a device that carries one
	// as the node's.
	NodeIPs func([]netip.Addr)
	// OnSync, if set, is called after every sync attempt, from the sync
	// loop's goroutine: keep it quick. Tests and benchmarks use it to learn
	// when the dataplane caught up.
	OnSync func(SyncResult)
}

// Watcher watches the API and drives a Dataplane. Create it with New and
// start it with Run.
type Watcher struct {
	log    *zap.Logger
	api    *apiObjects
	node   *nodeTracker
	runner *runner
	ran    atomic.Bool
	// cachesSynced is closed once the caches hold the complete state,
	// just before the first full reconcile.
	cachesSynced chan struct{}
}

// New builds a Watcher. Nothing talks to the API server before Run.
func New(cfg Config, client *apiclient.Clients, dp dataplane.Dataplane, log *zap.Logger) (*Watcher, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("watcher: NodeName is required: pass this node's name (e.g. --hostname-override or $NODE_NAME)")
	case client == nil || dp == nil:
		return nil, errors.New("watcher: a Kubernetes client and a dataplane are required")
	case cfg.MinSyncPeriod < 0 || cfg.SyncPeriod < 0:
		return nil, fmt.Errorf("watcher: sync periods must not be negative (min %v, full %v)", cfg.MinSyncPeriod, cfg.SyncPeriod)
	}
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = DefaultSyncPeriod
	}
	if cfg.MinSyncPeriod > cfg.SyncPeriod {
		return nil, fmt.Errorf("watcher: MinSyncPeriod %v is longer than SyncPeriod %v", cfg.MinSyncPeriod, cfg.SyncPeriod)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if log == nil {
		log = zap.NewNop()
	}

	started := time.Now()
	tracker := newChangeTracker(cfg.Metrics, cfg.Health, time.Now)
	node := newNodeTracker(cfg.NodeName, desired.NodeConfig{NodePortAddresses: cfg.NodePortAddresses, ExternalIPs: cfg.ExternalIPs}, cfg.Health)
	node.onNodeIPs = cfg.NodeIPs
	api, err := newAPIObjects(client, cfg.NodeName, tracker, node, started, log)
	if err != nil {
		return nil, fmt.Errorf("watcher: set up informers: %w", err)
	}
	if err := registerAPIMetrics(cfg.Metrics.Registry, api.conn); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	if refuser, ok := dp.(dataplane.Refuser); ok {
		// Reported from OnSync, so the sync loop itself need not know.
		rep := newRefusalReporter(refuser, api, cfg.Events, cfg.Metrics.ServicePortsRefused, log)
		onSync := cfg.OnSync
		cfg.OnSync = func(res SyncResult) {
			if res.Err == nil {
				rep.report()
			}
			if onSync != nil {
				onSync(res)
			}
		}
	}
	w := &Watcher{
		log:    log,
		api:    api,
		node:   node,
		runner: newRunner(cfg, tracker, newSyncer(api, node.current, dp, log), log),

		cachesSynced: make(chan struct{}),
	}
	return w, nil
}

// newRunner builds the sync loop from a validated Config.
func newRunner(cfg Config, tracker *changeTracker, s *syncer, log *zap.Logger) *runner {
	return &runner{
		tracker:       tracker,
		syncer:        s,
		metrics:       cfg.Metrics,
		health:        cfg.Health,
		serviceHealth: cfg.ServiceHealth,
		log:           log,
		now:           time.Now,
		minSyncPeriod: cfg.MinSyncPeriod,
		syncPeriod:    cfg.SyncPeriod,
		retryMin:      defaultRetryMin,
		retryMax:      defaultRetryMax,
		onSync:        cfg.OnSync,
		firstSync:     make(chan struct{}),
	}
}

// Run starts the informers, waits until their caches hold the complete
// state, runs a first full reconcile and then keeps the dataplane in step
// until ctx is done. It returns nil when ctx ends, an error only if it
// could not run at all. Run may be called once.
//
// While the API server is unreachable the informers retry on their own and
// the dataplane keeps what it has: an empty or stale cache is never taken
// to mean that Services were deleted.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("watcher: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	w.api.start(ctx.Done())
	// Waited for with the informers, so that nothing logs after Run.
	w.api.running.Go(func() { logAPIState(ctx, w.api.conn, w.log, apiLogInterval) })
	defer func() {
		cancel()
		w.api.shutdown()
	}()

	w.log.Info("Waiting for the Service, EndpointSlice and Node caches to sync")
	if !cache.WaitForCacheSync(ctx.Done(), w.api.synced...) {
		return nil // ctx ended first; nothing was synced, nothing to undo
	}
	if !w.node.known() {
		w.log.Warn("This node's Node object does not exist (yet): NodePorts are served on loopback only until it appears; check that the node name is right",
			zap.String("node", w.node.name))
	}
	w.log.Info("Caches synced; starting the dataplane sync loop",
		zap.Duration("minSyncPeriod", w.runner.minSyncPeriod), zap.Duration("syncPeriod", w.runner.syncPeriod))
	close(w.cachesSynced)
	w.runner.run(ctx)
	return nil
}

// CachesSynced is closed once the informer caches hold the complete state
// and the first full reconcile is about to start.
func (w *Watcher) CachesSynced() <-chan struct{} { return w.cachesSynced }

// FirstSync is closed once the first full reconcile has succeeded: the
// dataplane then serves every Service the API had at start-up.
func (w *Watcher) FirstSync() <-chan struct{} { return w.runner.firstSync }

// LastSync returns the result of the most recent sync attempt (the zero
// value before the first).
func (w *Watcher) LastSync() SyncResult { return w.runner.lastSync() }
