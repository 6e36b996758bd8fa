package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/util/teststorage"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// The scrape as kube-prometheus-stack's kube-proxy ServiceMonitor makes
// it, with the target labels the mixin's queries select on.
const (
	dashboardJob     = "kube-proxy"
	dashboardCluster = "e2e"
	scrapeInterval   = time.Second
	// rateInterval is Grafana's $__rate_interval for a short range: four
	// scrape intervals.
	rateInterval = 4 * scrapeInterval
)

// TestKubeProxyDashboard evaluates every panel of kubernetes-mixin's
// kube-proxy dashboard (testdata/kube-proxy-dashboard.txt) with
// Prometheus's own query engine over what a Prometheus scraping kpr's
// /metrics would store, and fails on a panel without data: a dashboard
// written for kube-proxy must keep showing data after the switch to kpr.
// The scraped stretch holds what a real one holds: kpr running, a restart
// (the API client's lists and kpr's start-up Event), and an endpoint
// change it programs.
func TestKubeProxyDashboard(t *testing.T) {
	forEachMode(t, []dataMode{modeEBPF, modeIPTablesNFT}, func(t *testing.T, m dataMode) {
		panels := readPanels(t)
		f := newModeFixture(t, m)
		ns := f.namespace(t, "dashboard")
		svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
		f.setEndpoints(t, svc, discoveryv1.AddressTypeIPv4, f.eps("pod-a")...)
		if err := f.kpr.WaitSynced(f.ctx); err != nil {
			t.Fatal(err)
		}

		s := startScraping(t, f.kpr)
		s.waitScrapes(t, 3)
		if err := f.kpr.Stop(); err != nil {
			t.Fatalf("stop kpr: %v", err)
		}
		if err := f.kpr.Restart(); err != nil {
			t.Fatalf("restart kpr: %v", err)
		}
		f.waitHealthy()
		if err := f.kpr.WaitSynced(f.ctx); err != nil {
			t.Fatal(err)
		}
		// An endpoint change as the EndpointSlice controller writes it,
		// timed from its trigger: network programming latency.
		slice := kubeobj.Slice(svc, svc.Name+"-ipv4", discoveryv1.AddressTypeIPv4, f.eps("pod-a", "pod-b")...)
		slice.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
		f.applySlice(t, slice)
		waitUntil(t, 30*time.Second, "kpr programs the endpoint change", func() error {
			return notMetric(f.kpr, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`, "0")
		})
		s.waitScrapes(t, int(2*rateInterval/scrapeInterval))
		start, end := s.stop()

		engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
		vars := strings.NewReplacer("$cluster", dashboardCluster, "$instance", ".+",
			"$__rate_interval", model.Duration(rateInterval).String())
		for _, p := range panels {
			var why []string
			hasData := false
			for _, query := range p.queries {
				q, err := engine.NewRangeQuery(f.ctx, s.db, nil, vars.Replace(query), start, end, scrapeInterval)
				if err != nil {
					t.Fatalf("panel %q: query %s: %v", p.title, query, err)
				}
				res := q.Exec(f.ctx)
				if res.Err != nil {
					t.Fatalf("panel %q: query %s: %v", p.title, query, res.Err)
				}
				matrix, err := res.Matrix()
				if err != nil {
					t.Fatalf("panel %q: query %s: %v", p.title, query, err)
				}
				switch {
				case finitePoints(matrix) > 0:
					hasData = true
				case startUpRequests[p.title] && len(matrix) > 0:
					hasData = true // shown, see startUpRequests
				default:
					why = append(why, fmt.Sprintf("%s: %d series, no finite point", query, len(matrix)))
				}
				q.Close()
			}
			if !hasData {
				t.Errorf("panel %q has no data:\n  %s", p.title, strings.Join(why, "\n  "))
			}
		}

		// kube-proxy's series that no panel shows but alerts and other
		// dashboards use, with kube-proxy's labels.
		others := []string{
			`kubernetes_build_info{git_version!=""}`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} > 0`,
			`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"} > 0`,
			`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} > 0`,
		}
		if m.iptables() {
			others = append(others,
				`kubeproxy_sync_proxy_rules_iptables_total{table="nat",ip_family="IPv4"} > 0`,
				`kubeproxy_sync_proxy_rules_iptables_total{table="filter",ip_family="IPv6"} > 0`,
				`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} == 0`,
				`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} == 0`)
		}
		for _, query := range others {
			q, err := engine.NewInstantQuery(f.ctx, s.db, nil, query, end)
			if err != nil {
				t.Fatalf("query %s: %v", query, err)
			}
			res := q.Exec(f.ctx)
			if vec, err := res.Vector(); err != nil || len(vec) == 0 {
				t.Errorf("%s: no series (%v)", query, errors.Join(res.Err, err))
			}
			q.Close()
		}
		if t.Failed() {
			t.Logf("last scrape:\n%s", s.lastText())
		}
	})
}

// startUpRequests are the panels of API requests that kpr, as kube-proxy
// 1.37, makes only at start-up: its GET of its Node and its POST of the
// Starting Event. The informers' requests are watches, which client-go
// 0.37 does not time, and kpr posts other Events only when a Service is
// refused. rate() sees no increase in a series that begins at its first
// request, so these quantiles are NaN (a restart keeps the counts where
// the last process left them); Grafana shows the series, as it does for
// kube-proxy, and the test asks for the series there, with kube-proxy's
// labels, instead of a finite point.
var startUpRequests = map[string]bool{
	"Post Request Latency 99th Quantile": true,
	"Get Request Latency 99th Quantile":  true,
}

// dashboardPanel is one panel of testdata/kube-proxy-dashboard.txt.
type dashboardPanel struct {
	title   string
	queries []string
}

func readPanels(t *testing.T) []dashboardPanel {
	t.Helper()
	file, err := os.Open("testdata/kube-proxy-dashboard.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var panels []dashboardPanel
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		title, query, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("testdata/kube-proxy-dashboard.txt: %q is not a title, a tab and a query", line)
		}
		if n := len(panels); n > 0 && panels[n-1].title == title {
			panels[n-1].queries = append(panels[n-1].queries, query)
		} else {
			panels = append(panels, dashboardPanel{title: title, queries: []string{query}})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// The mixin's dashboard has 11 panels; fewer means the file was cut.
	if len(panels) != 11 {
		t.Fatalf("testdata/kube-proxy-dashboard.txt has %d panels, want the dashboard's 11", len(panels))
	}
	return panels
}

func finitePoints(m promql.Matrix) int {
	n := 0
	for _, s := range m {
		for _, p := range s.Floats {
			if !math.IsNaN(p.F) && !math.IsInf(p.F, 0) {
				n++
			}
		}
	}
	return n
}

func notMetric(p *kprproc.Process, series, not string) error {
	v, err := p.Metric(series)
	if err != nil {
		return err
	}
	if v == not {
		return fmt.Errorf("%s is still %s", series, v)
	}
	return nil
}

// scraper is a Prometheus scrape loop in miniature: every scrapeInterval
// it reads kpr's /metrics, adds the target labels (job, instance,
// cluster) and stores every sample, and up (0 while kpr does not answer),
// in a TSDB.
type scraper struct {
	db     *teststorage.TestStorage
	proc   *kprproc.Process
	target labels.Labels

	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}

	mu          sync.Mutex
	scrapes     int
	first, last time.Time
	text        string
	err         error
}

func startScraping(t *testing.T, p *kprproc.Process) *scraper {
	s := &scraper{db: teststorage.New(t), proc: p, quit: make(chan struct{}), done: make(chan struct{}),
		target: labels.FromStrings("job", dashboardJob, "instance", p.MetricsAddr, "cluster", dashboardCluster)}
	go s.loop()
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *scraper) loop() {
	defer close(s.done)
	tick := time.NewTicker(scrapeInterval)
	defer tick.Stop()
	for {
		now := time.Now()
		err := s.scrape(now)
		s.mu.Lock()
		if s.first.IsZero() {
			s.first = now
		}
		s.last = now
		s.scrapes++
		if err != nil && s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
		select {
		case <-s.quit:
			return
		case <-tick.C:
		}
	}
}

// scrape stores one scrape at now. An unreachable kpr is up 0, as for
// Prometheus; a body that does not parse is an error of the test.
func (s *scraper) scrape(now time.Time) error {
	ts := now.UnixMilli()
	app := s.db.Appender(context.Background())
	text, getErr := s.proc.Metrics()
	up := 1.0
	if getErr != nil {
		up = 0
	}
	add := func(name string, extra map[string]string, v float64) error {
		b := labels.NewBuilder(s.target)
		b.Set(labels.MetricName, name)
		for k, val := range extra {
			b.Set(k, val)
		}
		_, err := app.Append(0, b.Labels(), ts, v)
		return err
	}
	if err := add("up", nil, up); err != nil {
		return err
	}
	if getErr == nil {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			_ = app.Rollback()
			return fmt.Errorf("parse kpr's /metrics: %w", err)
		}
		for _, fam := range families {
			if err := appendFamily(fam, add); err != nil {
				_ = app.Rollback()
				return err
			}
		}
		s.mu.Lock()
		s.text = text
		s.mu.Unlock()
	}
	return app.Commit()
}

// appendFamily stores a metric family as the text format's series: a
// histogram as its _bucket (with le), _sum and _count series.
func appendFamily(fam *dto.MetricFamily, add func(string, map[string]string, float64) error) error {
	name := fam.GetName()
	for _, m := range fam.GetMetric() {
		ls := map[string]string{}
		for _, lp := range m.GetLabel() {
			ls[lp.GetName()] = lp.GetValue()
		}
		with := func(k, v string) map[string]string {
			out := map[string]string{k: v}
			for lk, lv := range ls {
				out[lk] = lv
			}
			return out
		}
		var err error
		switch fam.GetType() {
		case dto.MetricType_COUNTER:
			err = add(name, ls, m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			err = add(name, ls, m.GetGauge().GetValue())
		case dto.MetricType_UNTYPED:
			err = add(name, ls, m.GetUntyped().GetValue())
		case dto.MetricType_HISTOGRAM:
			h := m.GetHistogram()
			for _, b := range h.GetBucket() {
				if err = add(name+"_bucket", with("le", formatLE(b.GetUpperBound())), float64(b.GetCumulativeCount())); err != nil {
					return err
				}
			}
			if err = add(name+"_bucket", with("le", "+Inf"), float64(h.GetSampleCount())); err != nil {
				return err
			}
			if err = add(name+"_sum", ls, h.GetSampleSum()); err == nil {
				err = add(name+"_count", ls, float64(h.GetSampleCount()))
			}
		case dto.MetricType_SUMMARY:
			sm := m.GetSummary()
			for _, q := range sm.GetQuantile() {
				if err = add(name, with("quantile", formatLE(q.GetQuantile())), q.GetValue()); err != nil {
					return err
				}
			}
			if err = add(name+"_sum", ls, sm.GetSampleSum()); err == nil {
				err = add(name+"_count", ls, float64(sm.GetSampleCount()))
			}
		}
		if err != nil {
			return fmt.Errorf("store %s: %w", name, err)
		}
	}
	return nil
}

func formatLE(v float64) string {
	if math.IsInf(v, +1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// waitScrapes waits for n more scrapes.
func (s *scraper) waitScrapes(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	want := s.scrapes + n
	s.mu.Unlock()
	deadline := time.Now().Add(time.Duration(n+5) * scrapeInterval)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		got, err := s.scrapes, s.err
		s.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if got >= want {
			return
		}
		time.Sleep(scrapeInterval / 10)
	}
	t.Fatalf("the scrape loop made fewer than %d scrapes in time", n)
}

// stop ends the loop and returns the time of its first and last scrape.
func (s *scraper) stop() (first, last time.Time) {
	s.stopOnce.Do(func() { close(s.quit) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first, s.last
}

func (s *scraper) lastText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text
}
