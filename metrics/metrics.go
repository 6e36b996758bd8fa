package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// subsystem yields kube-proxy's metric prefix "kubeproxy_".
const subsystem = "kubeproxy"

// Traffic policy label values of NoLocalEndpoints, as kube-proxy spells them.
const (
	TrafficPolicyInternal = "internal"
	TrafficPolicyExternal = "external"
)

// Metrics is the set of kube-proxy compatible metrics kpr maintains.
//
// kube-proxy labels several of these with ip_family because it runs one
// proxier per family; kpr programs both families in one sync, so the label
// would carry no information and is left out.
type Metrics struct {
	// Registry holds every metric below plus the Go runtime and process
	// collectors. Handler serves it.
	Registry *prometheus.Registry

	// SyncProxyRulesDuration is the wall time of one sync (partial or full).
	SyncProxyRulesDuration prometheus.Histogram
	// NetworkProgrammingDuration is the time from an EndpointSlice's
	// last-change-trigger-time annotation until the dataplane held the change.
	NetworkProgrammingDuration prometheus.Histogram
	// SyncProxyRulesLastTimestamp is the Unix time of the last successful sync.
	SyncProxyRulesLastTimestamp prometheus.Gauge
	// SyncProxyRulesLastQueuedTimestamp is the Unix time a sync was last
	// requested. Much larger than SyncProxyRulesLastTimestamp means stuck.
	SyncProxyRulesLastQueuedTimestamp prometheus.Gauge
	// EndpointChangesTotal counts EndpointSlice events seen.
	EndpointChangesTotal prometheus.Counter
	// EndpointChangesPending is the number of Services with endpoint changes
	// not yet in the dataplane.
	EndpointChangesPending prometheus.Gauge
	// ServiceChangesTotal counts Service events seen.
	ServiceChangesTotal prometheus.Counter
	// ServiceChangesPending is the number of Services with Service changes
	// not yet in the dataplane.
	ServiceChangesPending prometheus.Gauge
	// NoLocalEndpoints is the number of Service ports with a Local traffic
	// policy that have endpoints, but none on this node. Label traffic_policy
	// is TrafficPolicyInternal or TrafficPolicyExternal.
	NoLocalEndpoints *prometheus.GaugeVec
	// HealthzTotal and LivezTotal count /healthz and /livez answers by HTTP
	// status code ("200", "503").
	HealthzTotal *prometheus.CounterVec
	LivezTotal   *prometheus.CounterVec

	// kpr's own metrics, under the prefix "kpr_", for what kube-proxy has
	// no counterpart of.

	// SyncFailuresTotal counts syncs that failed to write the dataplane
	// (a failed syscall, not a Service that does not fit: that one is
	// refused alone, see ServicePortsRefused); each is retried with backoff.
	SyncFailuresTotal prometheus.Counter
	// MapEntries and MapMaxEntries give each BPF map's fill level (label
	// map): a map that fills up refuses new Services.
	MapEntries    *prometheus.GaugeVec
	MapMaxEntries *prometheus.GaugeVec
	// UDPSocketsDestroyedTotal counts connected UDP sockets destroyed
	// because their backend left the Service.
	UDPSocketsDestroyedTotal prometheus.Counter
	// ServicePortsRefused is the number of Service ports the dataplane
	// refuses right now (label reason, such as "MapFull") while it serves
	// every other one; each also has a Warning Event on its Service.
	ServicePortsRefused *prometheus.GaugeVec
	// ProxyMode is 1 for the dataplane kpr runs (label mode, what
	// /proxyMode answers) and why it runs it (label reason: "requested"
	// by --mode, or --mode auto's "ebpf-supported" or "ebpf-unavailable",
	// the fallback). kube-proxy has no such metric; it tells a fleet
	// which nodes fell back.
	ProxyMode *prometheus.GaugeVec
}

// kprNamespace prefixes kpr's own metrics.
const kprNamespace = "kpr"

// New creates the metrics and registers them in a fresh private registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncProxyRulesDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds",
			Buckets:   SyncDurationBuckets(),
		}),
		NetworkProgrammingDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "network_programming_duration_seconds",
			Help:      "In Cluster Network Programming Latency in seconds",
			Buckets:   NetworkProgrammingBuckets(),
		}),
		SyncProxyRulesLastTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_last_timestamp_seconds",
			Help:      "The last time proxy rules were successfully synced",
		}),
		SyncProxyRulesLastQueuedTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
			Help:      "The last time a sync of proxy rules was queued",
		}),
		EndpointChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_endpoint_changes_total",
			Help:      "Cumulative proxy rules Endpoint changes",
		}),
		EndpointChangesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_endpoint_changes_pending",
			Help:      "Pending proxy rules Endpoint changes",
		}),
		ServiceChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_service_changes_total",
			Help:      "Cumulative proxy rules Service changes",
		}),
		ServiceChangesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_service_changes_pending",
			Help:      "Pending proxy rules Service changes",
		}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_no_local_endpoints_total",
			Help:      "Number of services with a Local traffic policy and no endpoints",
		}, []string{"traffic_policy"}),
		HealthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem,
			Name:      "proxy_healthz_total",
			Help:      "Cumulative proxy healthz HTTP status",
		}, []string{"code"}),
		LivezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem,
			Name:      "proxy_livez_total",
			Help:      "Cumulative proxy livez HTTP status",
		}, []string{"code"}),
		SyncFailuresTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: kprNamespace,
			Name:      "sync_failures_total",
			Help:      "Syncs that failed to write the dataplane and will be retried",
		}),
		MapEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: kprNamespace,
			Name:      "bpf_map_entries",
			Help:      "Entries in a BPF map kpr writes, after the last sync",
		}, []string{"map"}),
		MapMaxEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: kprNamespace,
			Name:      "bpf_map_max_entries",
			Help:      "Capacity of a BPF map kpr writes (raise with kpr run --map-size-*)",
		}, []string{"map"}),
		UDPSocketsDestroyedTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: kprNamespace,
			Name:      "udp_sockets_destroyed_total",
			Help:      "Connected UDP sockets destroyed because their backend left the Service",
		}),
		ServicePortsRefused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: kprNamespace,
			Name:      "service_ports_refused",
			Help:      "Service ports the dataplane refuses while serving every other one (see the Service's Events)",
		}, []string{"reason"}),
		ProxyMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: kprNamespace,
			Name:      "proxy_mode",
			Help:      "The dataplane kpr runs (mode) and why (reason: requested, ebpf-supported, or ebpf-unavailable when --mode auto fell back); always 1",
		}, []string{"mode", "reason"}),
	}
	// Both policies are always exported, zero included, so that dashboards
	// see the series before the first Local Service appears.
	m.NoLocalEndpoints.WithLabelValues(TrafficPolicyInternal)
	m.NoLocalEndpoints.WithLabelValues(TrafficPolicyExternal)

	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.SyncProxyRulesDuration,
		m.NetworkProgrammingDuration,
		m.SyncProxyRulesLastTimestamp,
		m.SyncProxyRulesLastQueuedTimestamp,
		m.EndpointChangesTotal,
		m.EndpointChangesPending,
		m.ServiceChangesTotal,
		m.ServiceChangesPending,
		m.NoLocalEndpoints,
		m.HealthzTotal,
		m.LivezTotal,
		m.SyncFailuresTotal,
		m.MapEntries,
		m.MapMaxEntries,
		m.UDPSocketsDestroyedTotal,
		m.ServicePortsRefused,
		m.ProxyMode,
	)
	return m
}

// SyncDurationBuckets is kube-proxy's layout for sync durations: 1 ms
// doubling 15 times (up to about 16 s).
func SyncDurationBuckets() []float64 {
	return prometheus.ExponentialBuckets(0.001, 2, 15)
}

// NetworkProgrammingBuckets is kube-proxy's layout for network programming
// latency: 0.25 s and 0.5 s, then every second to 59 s, every 5 s to 115 s,
// and every 30 s to 5 min.
func NetworkProgrammingBuckets() []float64 {
	var b []float64
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	b = append(b, prometheus.LinearBuckets(120, 30, 7)...)
	return b
}
