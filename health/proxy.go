package health

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/kpr-io/kpr/metrics"
)

// DefaultBindAddress is kube-proxy's default --healthz-bind-address.
const DefaultBindAddress = "0.0.0.0:10256"

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to remove.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// ProxyConfig configures a ProxyServer.
type ProxyConfig struct {
	// Addr is the listen address for Run; empty means DefaultBindAddress.
	Addr string
	// Timeout is how long a queued change may wait for a successful sync
	// before the proxy counts as unhealthy. kube-proxy uses 2 × syncPeriod.
	Timeout time.Duration
	// Metrics, if set, counts answers in proxy_healthz_total and
	// proxy_livez_total.
	Metrics *metrics.Metrics
	// Clock defaults to the real clock; tests inject a fake one.
	Clock clock.PassiveClock
}

// Status is the JSON body of /healthz and /livez, field for field what
// kube-proxy answers (minus its per-IP-family breakdown).
type Status struct {
	// LastUpdated is the last successful sync, or the current time while
	// healthy (kube-proxy's backward-compatible meaning: "recent if healthy").
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is only reported by /healthz.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	Healthy      bool  `json:"healthy"`
}

// ProxyServer tracks sync health and node eligibility and answers the probes.
// Its methods are safe for concurrent use.
type ProxyServer struct {
	addr    string
	timeout time.Duration
	metrics *metrics.Metrics
	clock   clock.PassiveClock

	mu          sync.Mutex
	lastUpdated time.Time
	// oldestQueued is when the oldest change not yet synced was queued; zero
	// when nothing is pending.
	oldestQueued time.Time
	nodeEligible bool
}

// NewProxyServer returns a ProxyServer. Until SetNode reports an eligible node, /healthz
// answers 503, as kube-proxy does before it has seen its Node object.
func NewProxyServer(cfg ProxyConfig) *ProxyServer {
	s := &ProxyServer{addr: cfg.Addr, timeout: cfg.Timeout, metrics: cfg.Metrics, clock: cfg.Clock}
	if s.addr == "" {
		s.addr = DefaultBindAddress
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	return s
}

// QueuedUpdate records that a change was received but is not yet in the
// dataplane. Only the oldest pending change matters, so repeated calls before
// the next Updated keep the first time.
func (s *ProxyServer) QueuedUpdate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.oldestQueued.IsZero() {
		s.oldestQueued = s.clock.Now()
	}
}

// Updated records a successful sync: everything queued so far is programmed.
func (s *ProxyServer) Updated() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.oldestQueued = time.Time{}
	s.lastUpdated = s.clock.Now()
}

// SetNode reports the latest state of this node's Node object; nil means
// the Node is unknown or gone, which makes the node ineligible.
func (s *ProxyServer) SetNode(node *v1.Node) {
	eligible := NodeEligible(node)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeEligible = eligible
}

// NodeEligible reports whether a node should receive load-balancer traffic:
// it exists, is not being deleted and is not marked for removal by the
// cluster autoscaler.
func NodeEligible(node *v1.Node) bool {
	if node == nil || node.DeletionTimestamp != nil {
		return false
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// status computes the probe answer. Unlike kube-proxy, a change queued
// before the first successful sync also counts: a dataplane that never
// manages its first sync should not look healthy forever.
func (s *ProxyServer) status() (st Status, nodeEligible bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	st = Status{LastUpdated: s.lastUpdated, CurrentTime: now, Healthy: true}
	if !s.oldestQueued.IsZero() && now.Sub(s.oldestQueued) > s.timeout {
		st.Healthy = false
	}
	return st, s.nodeEligible
}

// Healthy reports what /healthz would answer: syncs are keeping up and the
// node is not going away.
func (s *ProxyServer) Healthy() bool {
	st, eligible := s.status()
	return st.Healthy && eligible
}

// Live reports what /livez would answer: syncs are keeping up, whatever
// becomes of the node.
func (s *ProxyServer) Live() bool {
	st, _ := s.status()
	return st.Healthy
}

// Handler serves /healthz and /livez.
func (s *ProxyServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.HandleFunc("/livez", s.serveLivez)
	return mux
}

// Run serves the probes on the configured address until ctx is done.
func (s *ProxyServer) Run(ctx context.Context) error {
	return metrics.ListenAndServe(ctx, s.addr, s.Handler())
}

func (s *ProxyServer) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	st, eligible := s.status()
	st.NodeEligible = &eligible
	st.Healthy = st.Healthy && eligible
	code := s.write(w, st)
	if s.metrics != nil {
		s.metrics.HealthzTotal.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

func (s *ProxyServer) serveLivez(w http.ResponseWriter, _ *http.Request) {
	st, _ := s.status()
	code := s.write(w, st)
	if s.metrics != nil {
		s.metrics.LivezTotal.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// write sends st as JSON and returns the HTTP status code used.
func (s *ProxyServer) write(w http.ResponseWriter, st Status) int {
	code := http.StatusOK
	if st.Healthy {
		// kube-proxy compatibility: a healthy proxy reports lastUpdated as
		// "now", since older releases synced periodically even without
		// changes and clients compare it with the current time.
		st.LastUpdated = st.CurrentTime
	} else {
		code = http.StatusServiceUnavailable
	}
	body, _ := json.Marshal(st) // cannot fail: plain struct of times and bools
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
	return code
}
