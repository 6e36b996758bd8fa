package metrics

import (
	"reflect"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/maps"
)

// The tc programs' state, read from their maps at scrape time: the
// conntrack map's fill level, and the per-CPU counters of kpr_tc_stats.
//
// Counting an LRU hash map's entries means reading all of them (the kernel
// keeps no count), so the count is cached for ConntrackCountInterval: a
// scrape every few seconds, or several scrapers, cost one count per
// interval. With batch lookups a full map of the default 131,072 entries is
// 32 syscalls (maps.ConntrackCounter). The counters are one lookup of a
// single per-CPU entry and are read at every scrape.

// ConntrackCountInterval is how old a conntrack count may be when scraped.
const ConntrackCountInterval = 10 * time.Second

// tcCounter is one field of bpf.KprNatStats as a series.
type tcCounter struct {
	field string // the Go field name in bpf.KprNatStats
	desc  *prometheus.Desc
	label string // the value of desc's one label, if it has one
}

var (
	tcDropsDesc = prometheus.NewDesc("kpr_tc_drops_total",
		"Packets the tc programs dropped, by reason", []string{"reason"}, nil)
	tcTranslationsDesc = prometheus.NewDesc("kpr_tc_translations_total",
		"Packets the tc programs rewrote: forward (to a backend), reply (back to the frontend), icmp_error (an ICMP error about a translated flow)",
		[]string{"direction"}, nil)
	tcFlowsDesc = prometheus.NewDesc("kpr_tc_flows_total",
		"Flows the tc programs started: new (every one), snat (to a backend on another node), affinity (to the client's ClientIP affinity backend)",
		[]string{"kind"}, nil)
	tcPassedDesc = prometheus.NewDesc("kpr_tc_passed_total",
		"Packets the tc programs passed untranslated that look like Service traffic: cluster_ip_outside (a ClusterIP from outside), fragment (IP fragments)",
		[]string{"reason"}, nil)
	tcRedirectedDesc = prometheus.NewDesc("kpr_tc_redirected_packets_total",
		"Packets the tc programs sent out through a FIB lookup and redirect", nil, nil)
	tcInsertFailuresDesc = prometheus.NewDesc("kpr_tc_conntrack_insert_failures_total",
		"New flows whose conntrack entries could not be stored (each is also a kpr_tc_drops_total{reason=\"conntrack_insert\"})", nil, nil)
	tcConntrackEntriesDesc = prometheus.NewDesc("kpr_tc_conntrack_entries",
		"Entries in the tc programs' conntrack map, two per flow, counted at most every 10s; near kpr_tc_conntrack_max_entries "+
			"the LRU map evicts live flows (raise with kpr run --map-size-conntrack)", nil, nil)
	tcConntrackMaxDesc = prometheus.NewDesc("kpr_tc_conntrack_max_entries",
		"Capacity of the tc programs' conntrack map", nil, nil)
	tcReadErrorsDesc = prometheus.NewDesc("kpr_tc_map_read_errors_total",
		"Scrapes that could not read a tc map; its series are left out of that scrape", nil, nil)
)

// tcCounters maps every field of bpf.KprNatStats to its series; a test
// checks that none is missing.
var tcCounters = []tcCounter{
	{"Translated", tcTranslationsDesc, "forward"},
	{"Reversed", tcTranslationsDesc, "reply"},
	{"IcmpTranslated", tcTranslationsDesc, "icmp_error"},
	{"NewFlows", tcFlowsDesc, "new"},
	{"Snat", tcFlowsDesc, "snat"},
	{"AffinityHit", tcFlowsDesc, "affinity"},
	{"DropNoBackend", tcDropsDesc, "no_backend"},
	{"DropCtInsert", tcDropsDesc, "conntrack_insert"},
	{"DropRewrite", tcDropsDesc, "rewrite"},
	{"DropSnatPorts", tcDropsDesc, "snat_ports"},
	{"DropSourceRange", tcDropsDesc, "source_range"},
	{"ClusterIpOutside", tcPassedDesc, "cluster_ip_outside"},
	{"Fragment", tcPassedDesc, "fragment"},
	{"Midstream", tcPassedDesc, "tcp_midstream"},
	{"Redirected", tcRedirectedDesc, ""},
	{"DropCtInsert", tcInsertFailuresDesc, ""},
}

// tcReader reads the tc maps; tests give a fake.
type tcReader interface {
	countConntrack() (int, error)
	conntrackMaxEntries() int
	stats() (bpf.KprNatStats, error)
}

type mapReader struct {
	counter  *maps.ConntrackCounter
	statsMap *ebpf.Map
}

func (r mapReader) countConntrack() (int, error)    { return r.counter.Count() }
func (r mapReader) conntrackMaxEntries() int        { return r.counter.MaxEntries() }
func (r mapReader) stats() (bpf.KprNatStats, error) { return maps.TCStats(r.statsMap) }

// TCCollector exports the tc programs' state at scrape time.
type TCCollector struct {
	r   tcReader
	now func() time.Time

	mu         sync.Mutex
	count      int
	countValid bool
	countedAt  time.Time
	readErrors uint64
}

// NewTCCollector reads conntrack (kpr_conntrack) and stats (kpr_tc_stats).
// Register it in Metrics.Registry.
func NewTCCollector(conntrack, stats *ebpf.Map) *TCCollector {
	return newTCCollector(mapReader{counter: maps.NewConntrackCounter(conntrack), statsMap: stats}, time.Now)
}

func newTCCollector(r tcReader, now func() time.Time) *TCCollector {
	return &TCCollector{r: r, now: now}
}

// Describe implements prometheus.Collector.
func (c *TCCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{tcDropsDesc, tcTranslationsDesc, tcFlowsDesc, tcPassedDesc, tcRedirectedDesc,
		tcInsertFailuresDesc, tcConntrackEntriesDesc, tcConntrackMaxDesc, tcReadErrorsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Scrapes may run at once; the
// lock makes them share one count.
func (c *TCCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.countValid || c.now().Sub(c.countedAt) >= ConntrackCountInterval {
		n, err := c.r.countConntrack()
		c.count, c.countValid, c.countedAt = n, err == nil, c.now()
		if err != nil {
			c.readErrors++
		}
	}
	if c.countValid {
		ch <- prometheus.MustNewConstMetric(tcConntrackEntriesDesc, prometheus.GaugeValue, float64(c.count))
	}
	ch <- prometheus.MustNewConstMetric(tcConntrackMaxDesc, prometheus.GaugeValue, float64(c.r.conntrackMaxEntries()))
	stats, err := c.r.stats()
	if err != nil {
		c.readErrors++
	} else {
		v := reflect.ValueOf(stats)
		for _, s := range tcCounters {
			var labels []string
			if s.label != "" {
				labels = []string{s.label}
			}
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(v.FieldByName(s.field).Uint()), labels...)
		}
	}
	ch <- prometheus.MustNewConstMetric(tcReadErrorsDesc, prometheus.CounterValue, float64(c.readErrors))
}
