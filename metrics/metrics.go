package metrics

import (
	"time"

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

// IP family label values, as kube-proxy spells its ip_family label
// (v1.IPFamily).
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Families are the ip_family values kpr exports. kube-proxy runs one
// proxier per family and labels its sync metrics with the proxier's
// family; kpr programs both families in every sync, so one sync is one
// observation in each family, as a dual-stack kube-proxy's two proxiers
// syncing together would give.
var Families = []string{IPv4, IPv6}

// Metrics is the set of kube-proxy compatible metrics kpr maintains.
type Metrics struct {
	// Registry holds every metric below plus the Go runtime and process
	// collectors. Handler serves it.
	Registry *prometheus.Registry

	// SyncProxyRulesDuration is the wall time of one sync (partial or
	// full), label ip_family; ObserveSync writes it.
	SyncProxyRulesDuration *prometheus.HistogramVec
	// SyncFullProxyRulesDuration and SyncPartialProxyRulesDuration split
	// SyncProxyRulesDuration by kind of sync.
	SyncFullProxyRulesDuration    *prometheus.HistogramVec
	SyncPartialProxyRulesDuration *prometheus.HistogramVec
	// NetworkProgrammingDuration is the time from an EndpointSlice's
	// last-change-trigger-time annotation until the dataplane held the
	// change, labelled with the slice's address family.
	NetworkProgrammingDuration *prometheus.HistogramVec
	// SyncProxyRulesLastTimestamp is the Unix time of the last successful
	// sync, per ip_family.
	SyncProxyRulesLastTimestamp *prometheus.GaugeVec
	// SyncProxyRulesLastQueuedTimestamp is the Unix time a sync was last
	// requested. Much larger than SyncProxyRulesLastTimestamp means stuck.
	SyncProxyRulesLastQueuedTimestamp *prometheus.GaugeVec
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
	// is TrafficPolicyInternal or TrafficPolicyExternal; ip_family is each
	// family of the Service (spec.ipFamilies).
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

	// BuildInfo is kubernetes_build_info, which every Kubernetes
	// component exports; SetBuildInfo fills it with kpr's own version.
	BuildInfo *prometheus.GaugeVec

	// The netfilter modes' metrics (netfilter.go), registered by the
	// mode that uses them, as kube-proxy registers them per mode.
	netfilter netfilterMetrics
}

// kprNamespace prefixes kpr's own metrics.
const kprNamespace = "kpr"

// New creates the metrics and registers them in a fresh private registry.
func New() *Metrics {
	m := &Metrics{
		Registry:                      prometheus.NewRegistry(),
		SyncProxyRulesDuration:        syncHistogram("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds"),
		SyncFullProxyRulesDuration:    syncHistogram("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs"),
		SyncPartialProxyRulesDuration: syncHistogram("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs"),
		NetworkProgrammingDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "network_programming_duration_seconds",
			Help:      "In Cluster Network Programming Latency in seconds",
			Buckets:   NetworkProgrammingBuckets(),
		}, []string{ipFamilyLabel}),
		SyncProxyRulesLastTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_last_timestamp_seconds",
			Help:      "The last time proxy rules were successfully synced",
		}, []string{ipFamilyLabel}),
		SyncProxyRulesLastQueuedTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
			Help:      "The last time a sync of proxy rules was queued",
		}, []string{ipFamilyLabel}),
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
		}, []string{"traffic_policy", ipFamilyLabel}),
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
		BuildInfo: newBuildInfo(),
	}
	// Every family's series exist from the start, zero included, so that
	// dashboards see them before the first sync or Local Service.
	for _, fam := range Families {
		m.SyncProxyRulesDuration.WithLabelValues(fam)
		m.SyncFullProxyRulesDuration.WithLabelValues(fam)
		m.SyncPartialProxyRulesDuration.WithLabelValues(fam)
		m.NetworkProgrammingDuration.WithLabelValues(fam)
		m.SyncProxyRulesLastTimestamp.WithLabelValues(fam)
		m.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(fam)
		m.NoLocalEndpoints.WithLabelValues(TrafficPolicyInternal, fam)
		m.NoLocalEndpoints.WithLabelValues(TrafficPolicyExternal, fam)
	}

	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.SyncProxyRulesDuration,
		m.SyncFullProxyRulesDuration,
		m.SyncPartialProxyRulesDuration,
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
		m.BuildInfo,
	)
	registerRESTClient(m.Registry)
	return m
}

// ipFamilyLabel is kube-proxy's label for the IP family a proxier syncs.
const ipFamilyLabel = "ip_family"

// syncHistogram is one of kube-proxy's sync duration histograms.
func syncHistogram(name, help string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem,
		Name:      name,
		Help:      help,
		Buckets:   SyncDurationBuckets(),
	}, []string{ipFamilyLabel})
}

// ObserveSync records one sync that took busy: in the duration histogram
// of every sync and in the full or partial one, in each family.
func (m *Metrics) ObserveSync(full bool, busy time.Duration) {
	kind := m.SyncPartialProxyRulesDuration
	if full {
		kind = m.SyncFullProxyRulesDuration
	}
	for _, fam := range Families {
		m.SyncProxyRulesDuration.WithLabelValues(fam).Observe(busy.Seconds())
		kind.WithLabelValues(fam).Observe(busy.Seconds())
	}
}

// SetLastSync records the end of the last successful sync, in each family.
func (m *Metrics) SetLastSync(at time.Time) {
	setEachFamily(m.SyncProxyRulesLastTimestamp, at)
}

// SetLastQueued records when a sync was last asked for, in each family.
func (m *Metrics) SetLastQueued(at time.Time) {
	setEachFamily(m.SyncProxyRulesLastQueuedTimestamp, at)
}

func setEachFamily(g *prometheus.GaugeVec, at time.Time) {
	for _, fam := range Families {
		g.WithLabelValues(fam).Set(float64(at.UnixNano()) / 1e9)
	}
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
