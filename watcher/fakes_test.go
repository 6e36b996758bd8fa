package watcher

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// This file holds the stand-ins the unit tests of the sync loop use instead
// of informers and a real dataplane. The informer part is covered by
// watcher_integration_test.go against a real API server. The translation is
// the real one (package desired): the objects the tests write are what an
// API server would hold, so the tests follow the path production takes.

const testNamespace = "ns"

// fakeSource is an objectSource over plain maps.
type fakeSource struct {
	mu       sync.Mutex
	services map[serviceName]*v1.Service
	slices   map[serviceName][]*discoveryv1.EndpointSlice
}

func (f *fakeSource) Service(key serviceName) (*v1.Service, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	svc, ok := f.services[key]
	return svc, ok
}

func (f *fakeSource) Slices(key serviceName) []*discoveryv1.EndpointSlice {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.slices[key])
}

func (f *fakeSource) ServiceNames() []serviceName {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.services))
}

// dpCall is one recorded Dataplane call.
type dpCall struct {
	reconcile bool
	ports     servicePorts
	err       error
}

// recordingDataplane records every call and fails the next failNext calls,
// calling onFail, if set, as each fails.
type recordingDataplane struct {
	mu       sync.Mutex
	failNext int
	onFail   func()
	calls    chan dpCall
}

func (d *recordingDataplane) call(reconcile bool, ports servicePorts) error {
	d.mu.Lock()
	var err error
	if d.failNext > 0 {
		d.failNext--
		err = errors.New("injected dataplane failure")
		if d.onFail != nil {
			d.onFail()
		}
	}
	d.mu.Unlock()
	d.calls <- dpCall{reconcile: reconcile, ports: maps.Clone(ports), err: err}
	return err
}

func (d *recordingDataplane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	return d.call(false, changes)
}

func (d *recordingDataplane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	return d.call(true, all)
}

func (d *recordingDataplane) failCalls(n int) {
	d.mu.Lock()
	d.failNext = n
	d.mu.Unlock()
}

// fakeHealth counts what the loop reports.
type fakeHealth struct {
	mu              sync.Mutex
	queued, updated int
}

func (h *fakeHealth) QueuedUpdate()    { h.mu.Lock(); h.queued++; h.mu.Unlock() }
func (h *fakeHealth) Updated()         { h.mu.Lock(); h.updated++; h.mu.Unlock() }
func (h *fakeHealth) SetNode(*v1.Node) {}
func (h *fakeHealth) counts() (queued, updated int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.queued, h.updated
}

// harness runs the sync loop over a fakeSource, playing the informers'
// part by telling the tracker about every change it makes.
type harness struct {
	t       *testing.T
	src     *fakeSource
	dp      *recordingDataplane
	tracker *changeTracker
	runner  *runner
	metrics *metrics.Metrics
	health  *fakeHealth
	logs    *observer.ObservedLogs
	syncs   chan SyncResult

	nodeMu sync.Mutex
	node   desired.Node
}

type harnessOptions struct {
	minSyncPeriod, syncPeriod time.Duration
	failFirstCalls            int
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	if o.syncPeriod == 0 {
		o.syncPeriod = time.Hour // no periodic full reconcile unless asked for
	}
	core, logs := observer.New(zap.DebugLevel)
	h := &harness{
		t:       t,
		src:     &fakeSource{services: map[serviceName]*v1.Service{}, slices: map[serviceName][]*discoveryv1.EndpointSlice{}},
		dp:      &recordingDataplane{failNext: o.failFirstCalls, calls: make(chan dpCall, 1000)},
		metrics: metrics.New(),
		health:  &fakeHealth{},
		logs:    logs,
		syncs:   make(chan SyncResult, 1000),
		node:    desired.Node{Name: "node-a"},
	}
	cfg := Config{
		MinSyncPeriod: o.minSyncPeriod,
		SyncPeriod:    o.syncPeriod,
		Metrics:       h.metrics,
		Health:        h.health,
		OnSync:        func(r SyncResult) { h.syncs <- r },
	}
	log := zap.New(core)
	h.tracker = newChangeTracker(h.metrics, h.health, time.Now)
	nodeFn := func() desired.Node {
		h.nodeMu.Lock()
		defer h.nodeMu.Unlock()
		return h.node
	}
	h.runner = newRunner(cfg, h.tracker, newSyncer(h.src, nodeFn, h.dp, log), log)
	h.runner.retryMin, h.runner.retryMax = 10*time.Millisecond, 40*time.Millisecond
	return h
}

// start runs the loop until the test ends.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.runner.run(ctx)
	}()
	h.t.Cleanup(func() {
		cancel()
		<-done
	})
}

func key(name string) serviceName { return serviceName{Namespace: testNamespace, Name: name} }

func portName(svc string) dataplane.ServicePortName {
	return dataplane.ServicePortName{Namespace: testNamespace, Name: svc, Port: "http", Protocol: dataplane.TCP}
}

// httpPort is the one port of the harness's Services: port 80, served by
// the endpoints on 8080.
var httpPort = kubeobj.Port{Name: "http", Port: 80, TargetPort: 8080}

// putService creates or replaces a ClusterIP Service with one port "http"
// (v1.ClusterIPNone makes it headless).
func (h *harness) putService(name, clusterIP string, mutate ...func(*v1.Service)) {
	svc := kubeobj.Service(testNamespace, name, httpPort)
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = clusterIP, []string{clusterIP}
	for _, m := range mutate {
		m(svc)
	}
	svc.ResourceVersion = nextResourceVersion()
	h.src.mu.Lock()
	h.src.services[key(name)] = svc
	h.src.mu.Unlock()
	h.tracker.serviceChanged(key(name))
}

// resourceVersions mimics the API server: every write gets a new version,
// which is what the syncer's translation cache keys on.
var resourceVersions atomic.Int64

func nextResourceVersion() string { return strconv.FormatInt(resourceVersions.Add(1), 10) }

func (h *harness) deleteService(name string) {
	h.src.mu.Lock()
	delete(h.src.services, key(name))
	h.src.mu.Unlock()
	h.tracker.serviceChanged(key(name))
}

// putEndpoints replaces the Service's slices by one slice holding addrs,
// ready and each on nodeName, serving port "http" on 8080.
func (h *harness) putEndpoints(name, nodeName string, trigger time.Time, addrs ...string) {
	var eps []kubeobj.Endpoint
	for _, a := range addrs {
		eps = append(eps, kubeobj.Endpoint{Addr: netip.MustParseAddr(a), NodeName: nodeName})
	}
	slice := kubeobj.Slice(kubeobj.Service(testNamespace, name, httpPort), name+"-abc", discoveryv1.AddressTypeIPv4, eps...)
	slice.ResourceVersion = nextResourceVersion()
	h.src.mu.Lock()
	h.src.slices[key(name)] = []*discoveryv1.EndpointSlice{slice}
	h.src.mu.Unlock()
	h.tracker.endpointsChanged(key(name), trigger, metrics.IPv4)
}

func (h *harness) setNode(n desired.Node) {
	h.nodeMu.Lock()
	h.node = n
	h.nodeMu.Unlock()
	h.tracker.allChanged()
}

// nextCall waits for the next Dataplane call.
func (h *harness) nextCall() dpCall {
	h.t.Helper()
	select {
	case c := <-h.dp.calls:
		return c
	case <-time.After(5 * time.Second):
		h.t.Fatal("no dataplane call within 5s")
	}
	return dpCall{}
}

// noCall checks that the dataplane is left alone for d.
func (h *harness) noCall(d time.Duration) {
	h.t.Helper()
	select {
	case c := <-h.dp.calls:
		h.t.Fatalf("unexpected dataplane call (reconcile=%v, %d ports)", c.reconcile, len(c.ports))
	case <-time.After(d):
	}
}

// nextSync waits for the next sync attempt.
func (h *harness) nextSync() SyncResult {
	h.t.Helper()
	select {
	case r := <-h.syncs:
		return r
	case <-time.After(5 * time.Second):
		h.t.Fatal("no sync within 5s")
	}
	return SyncResult{}
}

// syncSeeingAll waits for a successful sync that has seen every change
// queued so far.
func (h *harness) syncSeeingAll() SyncResult {
	h.t.Helper()
	queued := h.tracker.queuedSoFar()
	for {
		if r := h.nextSync(); r.Err == nil && r.upTo >= queued {
			return r
		}
	}
}

// backends returns the ClusterIP backends of a recorded ServicePort as strings.
func backends(sp *dataplane.ServicePort) []string {
	var out []string
	for _, b := range sp.Frontends[0].Backends {
		out = append(out, b.String())
	}
	return out
}

// expectPorts checks that a call carries exactly the given ServicePorts, and
// which of them are deletions (nil).
func expectPorts(t *testing.T, c dpCall, present []string, deleted []string) {
	t.Helper()
	if len(c.ports) != len(present)+len(deleted) {
		t.Errorf("call has %d ports %v, want %d present %v and %d deleted %v",
			len(c.ports), slices.Collect(maps.Keys(c.ports)), len(present), present, len(deleted), deleted)
	}
	for _, name := range present {
		if sp, ok := c.ports[portName(name)]; !ok || sp == nil {
			t.Errorf("call lacks ServicePort of %s", name)
		}
	}
	for _, name := range deleted {
		if sp, ok := c.ports[portName(name)]; !ok || sp != nil {
			t.Errorf("call does not delete ServicePort of %s (present=%v)", name, ok)
		}
	}
}
