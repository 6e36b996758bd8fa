package helm

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/deploy"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// oldestKube is the oldest Kubernetes the chart's kubeVersion admits; the
// tests render for it and for the test cluster's version.
var oldestKube = &chartutil.KubeVersion{Version: "v1.19.0", Major: "1", Minor: "19"}

// renderChart renders the chart into namespace with vals over its
// defaults, for the Kubernetes version kube, and returns its objects.
func renderChart(t *testing.T, namespace string, vals map[string]any, kube *chartutil.KubeVersion) []*unstructured.Unstructured {
	t.Helper()
	return renderChartAt(t, deploy.ChartDir(), namespace, vals, kube)
}

// renderChartAt is renderChart for the chart at path, a directory or a
// packaged .tgz.
func renderChartAt(t *testing.T, path, namespace string, vals map[string]any, kube *chartutil.KubeVersion) []*unstructured.Unstructured {
	t.Helper()
	chrt, err := loader.Load(path)
	if err != nil {
		t.Fatalf("load the chart %s: %v", path, err)
	}
	install := action.NewInstall(&action.Configuration{Log: t.Logf})
	install.ClientOnly, install.DryRun, install.Replace = true, true, true
	install.ReleaseName, install.Namespace, install.KubeVersion = "kpr", namespace, kube
	rel, err := install.Run(chrt, vals)
	if err != nil {
		t.Fatalf("render the chart: %v", err)
	}
	if len(rel.Hooks) > 0 {
		t.Errorf("the chart has %d hooks; the tests dry-run only its manifest", len(rel.Hooks))
	}
	objs, err := deploy.Parse([]byte(rel.Manifest))
	if err != nil {
		t.Fatalf("parse the rendered chart: %v\n%s", err, rel.Manifest)
	}
	return objs
}

func valuesFile(t *testing.T, path string) map[string]any {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

func renderKustomization(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// byKind indexes objs by "Kind/name".
func byKind(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		m[o.GetKind()+"/"+o.GetName()] = o
	}
	return m
}

func kinds(objs []*unstructured.Unstructured) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(ks)
	return ks
}

// TestChartDefaultsMatchTheBase keeps the chart and deploy/base from
// drifting apart: rendered with its defaults, the chart deploys the same
// objects as the base, whose RBAC, configuration and DaemonSet specs are
// equal field by field. Only metadata differs: Helm's labels, and the
// Pod template's checksum annotations. The same holds for the cleanup
// DaemonSet and deploy/cleanup.
func TestChartDefaultsMatchTheBase(t *testing.T) {
	base := byKind(renderKustomization(t, deploy.BaseDir()))
	// The base creates its namespace; the chart leaves it to
	// `helm install --create-namespace` unless namespace.create.
	chart := byKind(renderChart(t, deploy.Namespace, map[string]any{"namespace": map[string]any{"create": true}}, oldestKube))
	if got, want := slices.Sorted(maps.Keys(chart)), slices.Sorted(maps.Keys(base)); !slices.Equal(got, want) {
		t.Fatalf("the chart renders %v, the base %v", got, want)
	}
	for key, b := range base {
		c := chart[key]
		if c.GetNamespace() != b.GetNamespace() {
			t.Errorf("%s: namespace %q in the chart, %q in the base", key, c.GetNamespace(), b.GetNamespace())
		}
		for _, l := range []string{"app.kubernetes.io/name", "app.kubernetes.io/part-of", "k8s-app"} {
			if c.GetLabels()[l] != b.GetLabels()[l] {
				t.Errorf("%s: label %s=%q in the chart, %q in the base", key, l, c.GetLabels()[l], b.GetLabels()[l])
			}
		}
		var fields []string
		switch b.GetKind() {
		case "ClusterRole":
			fields = []string{"rules"}
		case "ClusterRoleBinding":
			fields = []string{"roleRef", "subjects"}
		case "ConfigMap":
			fields = []string{"data"}
		case "DaemonSet":
			fields = []string{"spec"}
		}
		for _, f := range fields {
			bv, cv := normalize(t, b.Object[f]), normalize(t, c.Object[f])
			if path, diff := firstDifference(f, bv, cv); path != "" {
				t.Errorf("%s: %s differs between deploy/base and the chart: %s", key, path, diff)
			}
		}
	}

	cleanupBase := byKind(renderKustomization(t, deploy.CleanupDir()))
	cleanupChart := byKind(renderChart(t, deploy.Namespace, map[string]any{"cleanup": map[string]any{"enabled": true}}, oldestKube))
	b, c := cleanupBase["DaemonSet/kpr-cleanup"], cleanupChart["DaemonSet/kpr-cleanup"]
	if b == nil || c == nil {
		t.Fatalf("no DaemonSet kpr-cleanup: deploy/cleanup has %v, the chart with cleanup.enabled %v", kinds(mapsValues(cleanupBase)), kinds(mapsValues(cleanupChart)))
	}
	if cleanupChart["DaemonSet/kpr"] != nil {
		t.Error("with cleanup.enabled the chart still renders kpr's DaemonSet, which would race the cleanup")
	}
	if path, diff := firstDifference("spec", normalize(t, b.Object["spec"]), normalize(t, c.Object["spec"])); path != "" {
		t.Errorf("DaemonSet kpr-cleanup: %s differs between deploy/cleanup and the chart: %s", path, diff)
	}
}

// normalize drops what may differ between the chart and the base without
// changing what runs: the Pod template's labels and annotations (Helm's
// own, and the checksums that roll the Pods on a configuration change).
// A ConfigMap's config.conf is compared as the YAML it holds.
func normalize(t *testing.T, v any) any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := maps.Clone(m)
	if tmpl, ok := out["template"].(map[string]any); ok {
		tmpl = maps.Clone(tmpl)
		delete(tmpl, "metadata")
		out["template"] = tmpl
	}
	if conf, ok := out["config.conf"].(string); ok {
		var parsed map[string]any
		if err := yaml.Unmarshal([]byte(conf), &parsed); err != nil {
			t.Fatalf("config.conf: %v", err)
		}
		out["config.conf"] = parsed
	}
	return out
}

func mapsValues(m map[string]*unstructured.Unstructured) []*unstructured.Unstructured {
	return slices.Collect(maps.Values(m))
}

// firstDifference returns the path of the first difference between a and
// b, and what it is; "" if they are equal.
func firstDifference(path string, a, b any) (string, string) {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := slices.Collect(maps.Keys(av))
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, d := firstDifference(path+"."+k, av[k], bv[k]); p != "" {
				return p, d
			}
		}
		return "", ""
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		for i := range av {
			if p, d := firstDifference(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i]); p != "" {
				return p, d
			}
		}
		return "", ""
	}
	if reflect.DeepEqual(a, b) {
		return "", ""
	}
	return path, fmt.Sprintf("base %s, chart %s", show(a), show(b))
}

func show(v any) string {
	if v == nil {
		return "(absent)"
	}
	out, _ := yaml.Marshal(v)
	return strings.TrimSpace(string(out))
}

// TestChartPassesADryRun renders the chart with its defaults, with a
// values file that moves every knob, and with cleanup.enabled, creates
// every object with a server-side dry run against a real API server, and
// checks what the ServiceAccount may do once its RBAC exists.
func TestChartPassesADryRun(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, err := deploy.NewApplier(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	// The chart's kubeVersion is checked against the test cluster's.
	kube := &chartutil.KubeVersion{Version: info.GitVersion, Major: info.Major, Minor: info.Minor}

	for _, tc := range []struct {
		name, namespace, serviceAccount string
		vals                            map[string]any
		check                           func(t *testing.T, objs map[string]*unstructured.Unstructured)
	}{
		{"defaults", deploy.Namespace, deploy.ServiceAccount, nil, nil},
		{"values file", "kpr-canary", "kpr-canary", valuesFile(t, filepath.Join("testdata", "values.yaml")), checkValuesFile},
		// Cluster-scoped names differ from the defaults' (created for
		// real above), which a dry run would find taken.
		{"cleanup", "kpr-cleanup-test", "", map[string]any{"cleanup": map[string]any{"enabled": true}, "namespace": map[string]any{"create": true},
			"devices": []any{"eth0"}, "fullnameOverride": "kpr-cleanup-test"}, checkCleanup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderChart(t, tc.namespace, tc.vals, kube)
			if tc.check != nil {
				tc.check(t, byKind(objs))
			}
			if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" }) {
				ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
					"metadata": map[string]any{"name": tc.namespace}}}
				if err := a.Create(ctx, ns, false); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.DryRunAll(ctx, objs); err != nil {
				t.Fatal(err)
			}
			if tc.serviceAccount == "" {
				return
			}
			// The ServiceAccount and its RBAC, for real, to ask about.
			for _, o := range objs {
				switch o.GetKind() {
				case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
					if err := a.Create(ctx, o, false); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := deploy.CheckLeastPrivilege(ctx, c.Client, tc.namespace, tc.serviceAccount); err != nil {
				t.Error(err)
			}
		})
	}
}

// checkValuesFile checks that testdata/values.yaml's knobs reach the
// objects.
func checkValuesFile(t *testing.T, objs map[string]*unstructured.Unstructured) {
	ds := objs["DaemonSet/kpr-canary"]
	if ds == nil || objs["Namespace/kpr-canary"] == nil || objs["ConfigMap/kpr-canary-config"] == nil {
		t.Fatalf("want the Namespace, ConfigMap kpr-canary-config and DaemonSet kpr-canary, got %v", kinds(mapsValues(objs)))
	}
	kpr := container(t, ds, "containers", "kpr")
	args, _, _ := unstructured.NestedStringSlice(kpr, "args")
	for _, want := range []string{"--log-level=debug", "--devices=eth0,bond0", "--map-size-services=524288", "--map-size-conntrack=262144"} {
		if !slices.Contains(args, want) {
			t.Errorf("kpr's args %v lack %s", args, want)
		}
	}
	flagsKnown(t, "run", args)
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--map-size-backends") }) {
		t.Errorf("kpr's args %v size the backend map, which the values leave at 0 (kpr's default)", args)
	}
	if kpr["image"] != "registry.example.com/mirror/kpr:v0.1.1" || kpr["imagePullPolicy"] != "Always" {
		t.Errorf("image %v, pull policy %v", kpr["image"], kpr["imagePullPolicy"])
	}
	if mem, _, _ := unstructured.NestedString(kpr, "resources", "limits", "memory"); mem != "512Mi" {
		t.Errorf("memory limit %q, want 512Mi", mem)
	}
	if port, _, _ := unstructured.NestedSlice(kpr, "ports"); len(port) != 1 || fmt.Sprint(port[0].(map[string]any)["containerPort"]) != "10266" {
		t.Errorf("ports %v, want the healthz port 10266 of config.healthzBindAddress", port)
	}
	if sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "spec", "nodeSelector"); sel["kpr.io/proxy"] != "kpr" {
		t.Errorf("nodeSelector %v", sel)
	}
	api, _, _ := unstructured.NestedStringMap(objs["ConfigMap/kpr-canary-apiserver"].Object, "data")
	if api["host"] != "10.0.0.10" || api["port"] != "443" {
		t.Errorf("API server address %v, want 10.0.0.10:443", api)
	}
	conf, _, _ := unstructured.NestedString(objs["ConfigMap/kpr-canary-config"].Object, "data", "config.conf")
	// kpr decodes the file strictly and warns about unknown fields; the
	// chart must write none.
	if err := yaml.UnmarshalStrict([]byte(conf), &kubeproxyconfig.KubeProxyConfiguration{}); err != nil {
		t.Errorf("config.conf is not a KubeProxyConfiguration: %v\n%s", err, conf)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(conf), &cfg); err != nil {
		t.Fatal(err)
	}
	ipt, _ := cfg["iptables"].(map[string]any)
	if cfg["mode"] != "iptables" || cfg["kind"] != "KubeProxyConfiguration" || !reflect.DeepEqual(cfg["nodePortAddresses"], []any{"primary"}) ||
		ipt["syncPeriod"] != "1m" || ipt["minSyncPeriod"] != "1s" {
		t.Errorf("config.conf has the values file's settings merged over the defaults wrongly:\n%s", conf)
	}
}

// checkCleanup checks that cleanup.enabled replaces kpr's DaemonSet by
// the cleanup one, which removes the tc programs from the devices kpr
// used.
func checkCleanup(t *testing.T, objs map[string]*unstructured.Unstructured) {
	if objs["DaemonSet/kpr-cleanup-test"] != nil {
		t.Error("with cleanup.enabled the chart still renders kpr's DaemonSet")
	}
	ds := objs["DaemonSet/kpr-cleanup-test-cleanup"]
	if ds == nil {
		t.Fatalf("no DaemonSet kpr-cleanup in %v", kinds(mapsValues(objs)))
	}
	cleanup := container(t, ds, "initContainers", "cleanup")
	args, _, _ := unstructured.NestedStringSlice(cleanup, "args")
	if !slices.Contains(args, "--devices=eth0") {
		t.Errorf("cleanup args %v lack --devices=eth0", args)
	}
	flagsKnown(t, "cleanup", args)
}

// flagsKnown checks that `kpr SUBCOMMAND --help` lists every flag in args.
func flagsKnown(t *testing.T, subcommand string, args []string) {
	t.Helper()
	kpr, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	help, err := exec.Command(kpr, subcommand, "--help").Output()
	if err != nil {
		t.Fatalf("kpr %s --help: %v", subcommand, err)
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		if !strings.Contains(string(help), " "+name+" ") {
			t.Errorf("kpr %s has no flag %s (given %s)", subcommand, name, a)
		}
	}
}

// container returns the container name in the Pod template's list.
func container(t *testing.T, ds *unstructured.Unstructured, list, name string) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", list)
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	t.Fatalf("DaemonSet %s has no %s %s", ds.GetName(), list, name)
	return nil
}

// TestChartLints runs `helm lint --strict` on the chart, with its
// defaults and with the values file: no warning, no error.
func TestChartLints(t *testing.T) {
	for name, vals := range map[string]map[string]any{"defaults": nil, "values file": valuesFile(t, filepath.Join("testdata", "values.yaml"))} {
		lint := action.NewLint()
		lint.Strict, lint.KubeVersion, lint.Namespace = true, oldestKube, deploy.Namespace
		res := lint.Run([]string{deploy.ChartDir()}, vals)
		for _, m := range res.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("%s: %s", name, m)
			}
		}
		for _, err := range res.Errors {
			t.Errorf("%s: %v", name, err)
		}
	}
}
