package metrics

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The tc programs' state, read from their maps at scrape time: the
// conntrack map's fill level, and the per-CPU counters of kpr_tc_stats.
//
// Counting an LRU hash map's entries means reading all of them (the kernel
// keeps no count), so the count is cached for ConntrackCountInterval: a
// scrape every few seconds, or several scrapers, cost one count per
// interval. With batch lookups a full map of the default 131,072 entries is
// 32 syscalls. The counters are one lookup of a single per-CPU entry and
// are read at every scrape.
//
// The maps belong to the eBPF backend, which supplies a TCReader (from
// cmd/kpr), so that this package, and everything that imports it, stays
// backend-neutral.

// ConntrackCountInterval is how old a conntrack count may be when scraped.
const ConntrackCountInterval = 10 * time.Second

// TCReader reads the tc programs' maps at scrape time.
type TCReader interface {
	// CountConntrack counts the entries of each conntrack map, by the
	// map's name: the eBPF backend keeps a flow in one map until it has
	// shown traffic both ways and in another after.
	CountConntrack() (map[string]int, error)
	// ConntrackMaxEntries is each conntrack map's capacity, by its name.
	ConntrackMaxEntries() map[string]int
	// Counters calls emit once per counter the programs keep, summed over
	// CPUs, named as the Go field of the eBPF backend's struct nat_stats
	// (Translated, DropNoBackend, ...): tcCounters says which series each
	// name feeds.
	Counters(emit func(name string, value uint64)) error
}

// tcCounter is one counter of struct nat_stats as a series.
type tcCounter struct {
	field string // the counter's name, as TCReader.Counters emits it
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
		"Flows the tc programs started: new (every one), snat (to a backend on another node), affinity (to the client's ClientIP affinity backend), "+
			"snat_takeover (given the SNAT port of a flow that had not shown traffic both ways, as under a SYN flood)",
		[]string{"kind"}, nil)
	tcPassedDesc = prometheus.NewDesc("kpr_tc_passed_total",
		"Packets the tc programs passed untranslated that look like Service traffic: cluster_ip_outside (a ClusterIP from outside), fragment (a later IP fragment whose first fragment had not passed), ipv6_ext_header (IPv6 whose TCP or UDP header lies behind an extension header kpr does not follow), tcp_midstream (a TCP segment other than a SYN of no known flow), v4_mapped (IPv6 with a ::ffff:a.b.c.d address, never taken for IPv4)",
		[]string{"reason"}, nil)
	tcICMPSentDesc = prometheus.NewDesc("kpr_tc_icmp_errors_sent_total",
		"ICMP errors the tc programs sent themselves, by type: too_big (fragmentation needed, or IPv6 packet too big, to the sender of a packet that did not fit the route to a backend on another node, or back to the client)",
		[]string{"type"}, nil)
	tcRejectedDesc = prometheus.NewDesc("kpr_tc_rejected_total",
		"New flows of pods on the packet path refused for a Service without endpoints, as kube-proxy's REJECT rule refuses them: a TCP reset, or ICMP port unreachable for UDP", nil, nil)
	tcRedirectedDesc = prometheus.NewDesc("kpr_tc_redirected_packets_total",
		"Packets the tc programs sent out through a FIB lookup and redirect", nil, nil)
	tcInsertFailuresDesc = prometheus.NewDesc("kpr_tc_conntrack_insert_failures_total",
		"New flows whose conntrack entries could not be stored (each is also a kpr_tc_drops_total{reason=\"conntrack_insert\"})", nil, nil)
	tcConntrackEntriesDesc = prometheus.NewDesc("kpr_tc_conntrack_entries",
		"Entries in the tc programs' conntrack maps, two per flow, counted at most every 10s: map kpr_conntrack holds the flows that showed "+
			"traffic both ways, kpr_ct_new the others. Near kpr_tc_conntrack_max_entries kpr_conntrack's LRU evicts idle live flows "+
			"(raise with kpr run --map-size-conntrack); kpr_ct_new's evicts half-open ones, as under a SYN flood (--map-size-conntrack-new)",
		[]string{"map"}, nil)
	tcConntrackMaxDesc = prometheus.NewDesc("kpr_tc_conntrack_max_entries",
		"Capacity of each of the tc programs' conntrack maps", []string{"map"}, nil)
	tcReadErrorsDesc = prometheus.NewDesc("kpr_tc_map_read_errors_total",
		"Scrapes that could not read a tc map; its series are left out of that scrape", nil, nil)
)

// tcCounters maps every counter of struct nat_stats to its series; the
// eBPF backend's tests (maps) check that none is missing either way.
var tcCounters = []tcCounter{
	{"Translated", tcTranslationsDesc, "forward"},
	{"Reversed", tcTranslationsDesc, "reply"},
	{"IcmpTranslated", tcTranslationsDesc, "icmp_error"},
	{"NewFlows", tcFlowsDesc, "new"},
	{"Snat", tcFlowsDesc, "snat"},
	{"AffinityHit", tcFlowsDesc, "affinity"},
	{"SnatTakeover", tcFlowsDesc, "snat_takeover"},
	{"DropNoBackend", tcDropsDesc, "no_backend"},
	{"DropCtInsert", tcDropsDesc, "conntrack_insert"},
	{"DropRewrite", tcDropsDesc, "rewrite"},
	{"DropSnatPorts", tcDropsDesc, "snat_ports"},
	{"DropSourceRange", tcDropsDesc, "source_range"},
	{"DropLoopback", tcDropsDesc, "loopback"},
	{"DropInvalidSyn", tcDropsDesc, "invalid_syn"},
	{"DropOutOfWindow", tcDropsDesc, "tcp_out_of_window"},
	{"DropReplyTaken", tcDropsDesc, "reply_taken"},
	{"DropFragment", tcDropsDesc, "fragment"},
	{"ClusterIpOutside", tcPassedDesc, "cluster_ip_outside"},
	{"Fragment", tcPassedDesc, "fragment"},
	{"Midstream", tcPassedDesc, "tcp_midstream"},
	{"V4Mapped", tcPassedDesc, "v4_mapped"},
	{"Ipv6ExtUnparsed", tcPassedDesc, "ipv6_ext_header"},
	{"Redirected", tcRedirectedDesc, ""},
	{"IcmpTooBig", tcICMPSentDesc, "too_big"},
	{"Rejected", tcRejectedDesc, ""},
	{"DropCtInsert", tcInsertFailuresDesc, ""},
}

// TCCollector exports the tc programs' state at scrape time.
type TCCollector struct {
	r   TCReader
	now func() time.Time

	mu         sync.Mutex
	count      map[string]int
	countValid bool
	countedAt  time.Time
	readErrors uint64
}

// NewTCCollector exports what r reads, as kpr_tc_* series. Register it in
// Metrics.Registry.
func NewTCCollector(r TCReader) *TCCollector {
	return newTCCollector(r, time.Now)
}

func newTCCollector(r TCReader, now func() time.Time) *TCCollector {
	return &TCCollector{r: r, now: now}
}

// Describe implements prometheus.Collector.
func (c *TCCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{tcDropsDesc, tcTranslationsDesc, tcFlowsDesc, tcPassedDesc, tcRedirectedDesc, tcICMPSentDesc, tcRejectedDesc,
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
		n, err := c.r.CountConntrack()
		c.count, c.countValid, c.countedAt = n, err == nil, c.now()
		if err != nil {
			c.readErrors++
		}
	}
	if c.countValid {
		for name, n := range c.count {
			ch <- prometheus.MustNewConstMetric(tcConntrackEntriesDesc, prometheus.GaugeValue, float64(n), name)
		}
	}
	for name, n := range c.r.ConntrackMaxEntries() {
		ch <- prometheus.MustNewConstMetric(tcConntrackMaxDesc, prometheus.GaugeValue, float64(n), name)
	}
	values := make(map[string]uint64, len(tcCounters))
	if err := c.r.Counters(func(name string, v uint64) { values[name] = v }); err != nil {
		c.readErrors++
	} else {
		for _, s := range tcCounters {
			var labels []string
			if s.label != "" {
				labels = []string{s.label}
			}
			v, ok := values[s.field]
			if !ok {
				// The backend and this table disagree: the scrape fails
				// visibly rather than showing the series as zero.
				ch <- prometheus.NewInvalidMetric(s.desc, fmt.Errorf("the tc programs report no counter %s; the eBPF backend and metrics.tcCounters disagree", s.field))
				continue
			}
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(v), labels...)
		}
	}
	ch <- prometheus.MustNewConstMetric(tcReadErrorsDesc, prometheus.CounterValue, float64(c.readErrors))
}
