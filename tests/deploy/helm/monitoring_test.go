package helm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/deploy"
	"github.com/kpr-io/kpr/watcher"
)

// exportedMetrics are the names of every series kpr's /metrics can
// serve, read from the real collectors: metrics.New's registry (kpr's and
// kube-proxy's metrics, client-go's, Go's and the process's), with what
// `kpr run` registers beside it in each mode: the netfilter modes'
// metrics, the eBPF mode's tc and socket-hook collectors (here with
// readers that read nothing: only their descriptions count) and the
// watcher's API connection gauges (a watcher that never runs). A
// collector kpr registers that is missing here makes the check below
// fail on the dashboard or alert that uses its metric, never pass
// wrongly. (The tc reader fails its reads, which the collector counts
// and reports without the counters' series: their names come from the
// descriptions.) The value is the metric's type, where a sample says it
// (histograms and summaries, whose series take _bucket, _sum and _count).
func exportedMetrics(t *testing.T) map[string]dto.MetricType {
	t.Helper()
	m := metrics.New()
	m.IPTables()
	m.NFTables()
	m.Conntrack()
	m.Registry.MustRegister(metrics.NewTCCollector(noTCMaps{}),
		metrics.NewSockStatsCollector(func(func(metrics.SockHookCounts)) error { return nil }))
	clients, err := apiclient.ForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watcher.New(watcher.Config{NodeName: "node", Metrics: m}, clients, noDataplane{}, nil); err != nil {
		t.Fatal(err)
	}

	names := map[string]dto.MetricType{}
	descs := make(chan *prometheus.Desc)
	go func() {
		m.Registry.Describe(descs)
		close(descs)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if n := fqName.FindStringSubmatch(d.String()); n != nil {
			names[n[1]] = dto.MetricType_UNTYPED
		}
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		names[f.GetName()] = f.GetType()
	}
	if len(names) < 50 {
		t.Fatalf("only %d metrics described: %v", len(names), slices.Sorted(maps.Keys(names)))
	}
	return names
}

type noTCMaps struct{}

func (noTCMaps) CountConntrack() (map[string]int, error) { return nil, nil }
func (noTCMaps) ConntrackMaxEntries() map[string]int     { return nil }
func (noTCMaps) Counters(func(name string, value uint64)) error {
	return errors.New("no tc maps in this test")
}

type noDataplane struct{}

func (noDataplane) Apply(map[dataplane.ServicePortName]*dataplane.ServicePort) error     { return nil }
func (noDataplane) Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort) error { return nil }

// prometheusMade are series Prometheus makes itself for every target.
var prometheusMade = map[string]bool{"up": true}

// checkMetricNames parses the PromQL expr and fails for each metric it
// selects that kpr does not export.
func checkMetricNames(t *testing.T, where, expr string, exported map[string]dto.MetricType) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %s: %v", where, expr, err)
		return
	}
	n := 0
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		n++
		if !isExported(name, exported) {
			t.Errorf("%s: %s selects %s, which kpr does not export", where, expr, name)
		}
		return nil
	})
	if n == 0 {
		t.Errorf("%s: %s selects no metric", where, expr)
	}
}

func isExported(name string, exported map[string]dto.MetricType) bool {
	if prometheusMade[name] {
		return true
	}
	if _, ok := exported[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch exported[base] {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return true
		case dto.MetricType_SUMMARY:
			return suffix != "_bucket"
		}
	}
	return false
}

// renderMonitoring renders the chart with every monitoring object on.
func renderMonitoring(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	return byKind(renderChart(t, deploy.Namespace, map[string]any{
		"config": map[string]any{"metricsBindAddress": "0.0.0.0:10249"},
		"monitoring": map[string]any{
			"podMonitor":     map[string]any{"enabled": true},
			"prometheusRule": map[string]any{"enabled": true},
			"dashboard":      map[string]any{"enabled": true},
		},
	}, oldestKube))
}

// strictly decodes u into out, failing on a field out's type lacks: the
// Prometheus Operator's CRDs are not in the test cluster, so their Go
// types check the fields the chart writes.
func strictly(t *testing.T, u *unstructured.Unstructured, out any) {
	t.Helper()
	data, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Errorf("%s %s is not a valid %T: %v", u.GetKind(), u.GetName(), out, err)
	}
}

// TestAlertsUseKprsMetrics checks the PrometheusRule: every alert's
// expression parses and selects only metrics kpr exports, each has a
// severity, a summary and a runbook_url whose section exists in
// docs/operations.md, and the rule has the alerts an on-call engineer
// needs.
func TestAlertsUseKprsMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	objs := renderMonitoring(t)
	u := objs["PrometheusRule/kpr"]
	if u == nil {
		t.Fatalf("monitoring.prometheusRule.enabled renders no PrometheusRule kpr: %v", kinds(mapsValues(objs)))
	}
	var rule monitoringv1.PrometheusRule
	strictly(t, u, &rule)
	anchors := runbookAnchors(t)
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			where := "alert " + r.Alert
			alerts = append(alerts, r.Alert)
			checkMetricNames(t, where, r.Expr.String(), exported)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s lacks a severity, summary or description: %v %v", where, r.Labels, r.Annotations)
			}
			url := r.Annotations["runbook_url"]
			page, anchor, ok := strings.Cut(url, "#")
			if !ok || !strings.HasSuffix(page, "/docs/operations.md") || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is no section of docs/operations.md (its sections: %v)", where, url, slices.Sorted(maps.Keys(anchors)))
			}
			for _, tmpl := range r.Annotations {
				if strings.Contains(tmpl, "{{") && !strings.Contains(tmpl, "$labels") && !strings.Contains(tmpl, "$value") {
					t.Errorf("%s: annotation %q has a template that names neither $labels nor $value", where, tmpl)
				}
			}
		}
	}
	for _, want := range []string{"KprDown", "KprSyncFailing", "KprBPFMapNearlyFull", "KprServicePortsRefused",
		"KprNetworkProgrammingSlow", "KprConntrackNearlyFull", "KprAPIConnectionLost"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("the PrometheusRule has no alert %s: %v", want, alerts)
		}
	}
}

// runbookAnchors are the GitHub anchors of docs/operations.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deploy.ChartDir(), "..", "..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(heading), ""), " ", "-")] = true
	}
	return anchors
}

// grafanaVars stand for the dashboard's variables, as Grafana fills them.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "${datasource}", "prometheus", "$job", "kpr", "$node", ".+")

// labelValues is Grafana's label_values(EXPR, LABEL) of a query variable.
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_]+\)$`)

// TestDashboardUsesKprsMetrics checks kpr's Grafana dashboard: the
// chart's copy is deploy/grafana/kpr.json byte for byte, it is valid
// JSON, and every PromQL expression of its panels and variables parses
// and selects only metrics kpr exports. The chart ships it in a
// ConfigMap with Grafana's sidecar label.
func TestDashboardUsesKprsMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	file := filepath.Join(deploy.ChartDir(), "..", "..", "grafana", "kpr.json")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	inChart, err := os.ReadFile(filepath.Join(deploy.ChartDir(), "dashboards", "kpr.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, inChart) {
		t.Errorf("deploy/helm/kpr/dashboards/kpr.json differs from deploy/grafana/kpr.json: copy the one you changed over the other")
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	exprs := 0
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				p := path + "." + k
				s, ok := child.(string)
				switch {
				case ok && k == "expr":
					exprs++
					checkMetricNames(t, p, grafanaVars.Replace(s), exported)
				case ok && k == "definition":
					m := labelValues.FindStringSubmatch(s)
					if m == nil {
						t.Errorf("%s: %q is not label_values(EXPR, LABEL)", p, s)
						continue
					}
					exprs++
					checkMetricNames(t, p, grafanaVars.Replace(m[1]), exported)
				default:
					walk(p, child)
				}
			}
		case []any:
			for i, child := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), child)
			}
		}
	}
	walk("", dash)
	if exprs < 10 {
		t.Errorf("the dashboard has %d queries; did the walk miss them?", exprs)
	}

	objs := renderMonitoring(t)
	cm := objs["ConfigMap/kpr-dashboard"]
	if cm == nil {
		t.Fatalf("monitoring.dashboard.enabled renders no ConfigMap kpr-dashboard: %v", kinds(mapsValues(objs)))
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard's ConfigMap has labels %v, without Grafana's sidecar label grafana_dashboard", cm.GetLabels())
	}
	if got, _, _ := unstructured.NestedString(cm.Object, "data", "kpr.json"); got != string(data) {
		t.Error("the dashboard's ConfigMap does not hold deploy/grafana/kpr.json")
	}
}

// TestPodMonitorScrapesKpr checks the PodMonitor and what it needs of the
// DaemonSet: a container port named as its endpoint's, at the metrics
// address's port, and the job and node labels the alerts and dashboard
// select on. Without the PodMonitor, the DaemonSet has no metrics port (as
// deploy/base), and NOTES warn when the metrics listen on loopback.
func TestPodMonitorScrapesKpr(t *testing.T) {
	objs := renderMonitoring(t)
	u := objs["PodMonitor/kpr"]
	if u == nil {
		t.Fatalf("monitoring.podMonitor.enabled renders no PodMonitor kpr: %v", kinds(mapsValues(objs)))
	}
	strictly(t, u, &monitoringv1.PodMonitor{})
	jobLabel, _, _ := unstructured.NestedString(u.Object, "spec", "jobLabel")
	selector, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	endpoints, _, _ := unstructured.NestedSlice(u.Object, "spec", "podMetricsEndpoints")
	if jobLabel != "k8s-app" || len(endpoints) != 1 {
		t.Fatalf("PodMonitor spec %v: want jobLabel k8s-app (job=\"kpr\") and one endpoint", u.Object["spec"])
	}
	ep, _ := endpoints[0].(map[string]any)
	ds := objs["DaemonSet/kpr"]
	tmplLabels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
	if tmplLabels[jobLabel] != "kpr" {
		t.Errorf("the Pods' %s label is %q, want kpr (the alerts' job)", jobLabel, tmplLabels[jobLabel])
	}
	for k, v := range selector {
		if tmplLabels[k] != v {
			t.Errorf("the PodMonitor selects %s=%s, which kpr's Pods lack (%v)", k, v, tmplLabels)
		}
	}
	if !strings.Contains(fmt.Sprint(ep["relabelings"]), "__meta_kubernetes_pod_node_name") {
		t.Errorf("the PodMonitor does not label series with the node's name: %v", ep["relabelings"])
	}
	ports, _, _ := unstructured.NestedSlice(container(t, ds, "containers", "kpr"), "ports")
	if !strings.Contains(fmt.Sprint(ports), fmt.Sprintf("map[containerPort:10249 name:%v]", ep["port"])) {
		t.Errorf("the PodMonitor scrapes port %v; kpr's container ports are %v", ep["port"], ports)
	}

	// NOTES say when the metrics listen where no Prometheus reaches them.
	notes := renderRelease(t, deploy.Namespace, map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}}},
		oldestKube).Info.Notes
	if !strings.Contains(notes, "config.metricsBindAddress is 127.0.0.1:10249, on loopback") {
		t.Errorf("with the PodMonitor and metrics on loopback, NOTES do not warn:\n%s", notes)
	}
	if notes := renderRelease(t, deploy.Namespace, map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}},
		"config": map[string]any{"metricsBindAddress": "0.0.0.0:10249"}}, oldestKube).Info.Notes; strings.Contains(notes, "on loopback") {
		t.Errorf("with the PodMonitor and metrics on 0.0.0.0, NOTES warn:\n%s", notes)
	}

	// The defaults: no PodMonitor, no metrics port, as the base.
	objs = byKind(renderChart(t, deploy.Namespace, nil, oldestKube))
	ports, _, _ = unstructured.NestedSlice(container(t, objs["DaemonSet/kpr"], "containers", "kpr"), "ports")
	if len(ports) != 1 {
		t.Errorf("without the PodMonitor kpr's container has ports %v, want healthz alone", ports)
	}
	for key := range objs {
		if strings.HasPrefix(key, "PodMonitor/") || strings.HasPrefix(key, "PrometheusRule/") || key == "ConfigMap/kpr-dashboard" {
			t.Errorf("the defaults render %s; monitoring is off by default", key)
		}
	}
}
