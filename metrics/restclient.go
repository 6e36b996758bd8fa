package metrics

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// client-go's request metrics (rest_client_*), with the names, labels and
// buckets component-base gives them in every Kubernetes component.
// client-go reports into one set of adapters per process, so the vectors
// are the process's; every Metrics registry serves them.
var restClient = struct {
	latency, rateLimiterLatency *prometheus.HistogramVec
	resolverLatency             *prometheus.HistogramVec
	requestSize, responseSize   *prometheus.HistogramVec
	requestResult, requestRetry *prometheus.CounterVec
	transportCacheEntries       prometheus.Gauge
	transportCreateCalls        *prometheus.CounterVec
	registerOnce                sync.Once
	all                         []prometheus.Collector
}{
	latency:            restHistogram("rest_client_request_duration_seconds", "Request latency in seconds. Broken down by verb, and host.", latencyBuckets, "verb", "host"),
	rateLimiterLatency: restHistogram("rest_client_rate_limiter_duration_seconds", "Client side rate limiter latency in seconds. Broken down by verb, and host.", latencyBuckets, "verb", "host"),
	resolverLatency:    restHistogram("rest_client_dns_resolution_duration_seconds", "DNS resolver latency in seconds. Broken down by host.", latencyBuckets[:len(latencyBuckets)-1], "host"),
	requestSize:        restHistogram("rest_client_request_size_bytes", "Request size in bytes. Broken down by verb and host.", sizeBuckets, "verb", "host"),
	responseSize:       restHistogram("rest_client_response_size_bytes", "Response size in bytes. Broken down by verb and host.", sizeBuckets, "verb", "host"),
	requestResult: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "Number of HTTP requests, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"}),
	requestRetry: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_request_retries_total",
		Help: "Number of request retries, partitioned by status code, verb, and host.",
	}, []string{"code", "verb", "host"}),
	transportCacheEntries: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rest_client_transport_cache_entries",
		Help: "Number of transport entries in the internal cache.",
	}),
	transportCreateCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_transport_create_calls_total",
		Help: "Number of calls to get a new transport, partitioned by the result of the operation hit: obtained from the cache, miss: created and added to the cache, uncacheable: created and not cached",
	}, []string{"result"}),
}

var (
	latencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}
	sizeBuckets    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}
)

func restHistogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

// registerRESTClient hands client-go the adapters (once per process, as
// client-go takes them only once) and serves the vectors from reg.
func registerRESTClient(reg prometheus.Registerer) {
	rc := &restClient
	rc.registerOnce.Do(func() {
		rc.all = []prometheus.Collector{rc.latency, rc.rateLimiterLatency, rc.resolverLatency, rc.requestSize,
			rc.responseSize, rc.requestResult, rc.requestRetry, rc.transportCacheEntries, rc.transportCreateCalls}
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestLatency:        latencyAdapter{rc.latency},
			RateLimiterLatency:    latencyAdapter{rc.rateLimiterLatency},
			ResolverLatency:       resolverAdapter{rc.resolverLatency},
			RequestSize:           sizeAdapter{rc.requestSize},
			ResponseSize:          sizeAdapter{rc.responseSize},
			RequestResult:         resultAdapter{rc.requestResult},
			RequestRetry:          resultAdapter{rc.requestRetry},
			TransportCacheEntries: cacheAdapter{rc.transportCacheEntries},
			TransportCreateCalls:  createCallsAdapter{rc.transportCreateCalls},
		})
	})
	reg.MustRegister(rc.all...)
}

type latencyAdapter struct{ m *prometheus.HistogramVec }

func (a latencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	a.m.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}

type resolverAdapter struct{ m *prometheus.HistogramVec }

func (a resolverAdapter) Observe(_ context.Context, host string, latency time.Duration) {
	a.m.WithLabelValues(host).Observe(latency.Seconds())
}

type sizeAdapter struct{ m *prometheus.HistogramVec }

func (a sizeAdapter) Observe(_ context.Context, verb, host string, size float64) {
	a.m.WithLabelValues(verb, host).Observe(size)
}

// resultAdapter serves both the result and the retry counter, whose
// labels are (code, method or verb, host) in that order.
type resultAdapter struct{ m *prometheus.CounterVec }

func (a resultAdapter) Increment(_ context.Context, code, method, host string) {
	a.m.WithLabelValues(code, method, host).Inc()
}

func (a resultAdapter) IncrementRetry(ctx context.Context, code, method, host string) {
	a.Increment(ctx, code, method, host)
}

type cacheAdapter struct{ m prometheus.Gauge }

func (a cacheAdapter) Observe(value int) { a.m.Set(float64(value)) }

type createCallsAdapter struct{ m *prometheus.CounterVec }

func (a createCallsAdapter) Increment(result string) { a.m.WithLabelValues(result).Inc() }
