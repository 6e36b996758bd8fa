package helm

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/release"
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

// baseKube is the oldest Kubernetes deploy/base is for: it sets the Pods'
// securityContext.appArmorProfile, which the chart sets from 1.30 on
// (before, the equivalent annotation).
var baseKube = &chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

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
	rel := renderReleaseAt(t, path, namespace, vals, kube)
	objs, err := deploy.Parse([]byte(rel.Manifest))
	if err != nil {
		t.Fatalf("parse the rendered chart: %v\n%s", err, rel.Manifest)
	}
	return objs
}

// renderRelease renders the chart as `helm template` does and returns
// the release: its manifest and its NOTES.
func renderRelease(t *testing.T, namespace string, vals map[string]any, kube *chartutil.KubeVersion) *release.Release {
	t.Helper()
	return renderReleaseAt(t, deploy.ChartDir(), namespace, vals, kube)
}

// renderReleaseAt is renderRelease for the chart at path.
func renderReleaseAt(t *testing.T, path, namespace string, vals map[string]any, kube *chartutil.KubeVersion) *release.Release {
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
	return rel
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
// equal field by field. Only metadata differs: Helm's labels, the Pod
// template's checksum annotations, and the names of the base's
// ConfigMaps, which kustomize's generator suffixes with a hash of their
// content (the base's way to roll the Pods on a change). The same holds
// for the cleanup DaemonSet and deploy/cleanup.
func TestChartDefaultsMatchTheBase(t *testing.T) {
	base := byKind(unhashConfigMaps(t, renderKustomization(t, deploy.BaseDir())))
	// The base creates its namespace; the chart leaves it to
	// `helm install --create-namespace` unless namespace.create.
	chart := byKind(renderChart(t, deploy.Namespace, map[string]any{"namespace": map[string]any{"create": true}}, baseKube))
	if got, want := slices.Sorted(maps.Keys(chart)), slices.Sorted(maps.Keys(base)); !slices.Equal(got, want) {
		t.Fatalf("the chart renders %v, the base %v", got, want)
	}
	for key, b := range base {
		c := chart[key]
		if c.GetNamespace() != b.GetNamespace() {
			t.Errorf("%s: namespace %q in the chart, %q in the base", key, c.GetNamespace(), b.GetNamespace())
		}
		for _, l := range []string{"app.kubernetes.io/name", "app.kubernetes.io/part-of", "k8s-app",
			"pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/audit", "pod-security.kubernetes.io/warn"} {
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
	cleanupChart := byKind(renderChart(t, deploy.Namespace, map[string]any{"cleanup": map[string]any{"enabled": true}}, baseKube))
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

// hashedName is a name kustomize's configMapGenerator made: the
// generator's name and a hash of the content.
var hashedName = regexp.MustCompile(`^(.+)-[bcdfghkmt2-9]{10}$`)

// unhashConfigMaps gives the generated ConfigMaps of objs the names they
// have in the chart, in their own metadata and wherever the other
// objects name them. It fails if the base has a ConfigMap that is not
// generated: a changed configuration must get a new name, which rolls
// the DaemonSet.
func unhashConfigMaps(t *testing.T, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	names := map[string]string{}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			continue
		}
		m := hashedName.FindStringSubmatch(o.GetName())
		if m == nil {
			t.Errorf("deploy/base's ConfigMap %s is not named after its content (configMapGenerator): a change would not roll the DaemonSet", o.GetName())
			continue
		}
		names[o.GetName()] = m[1]
		o.SetName(m[1])
	}
	var rename func(v any) any
	rename = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				v[k] = rename(child)
			}
		case []any:
			for i, child := range v {
				v[i] = rename(child)
			}
		case string:
			if n, ok := names[v]; ok {
				return n
			}
		}
		return v
	}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			rename(o.Object)
		}
	}
	return objs
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
			"devices": []any{"eth0", `bond0";touch /tmp/kpr-quoted`}, "fullnameOverride": "kpr-cleanup-test"}, checkCleanup},
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
			// The Prometheus Operator's kinds have no CRDs in the test
			// cluster; monitoring_test.go decodes them strictly instead.
			objs = slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool {
				return o.GroupVersionKind().Group == "monitoring.coreos.com"
			})
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
			perPod := tc.vals["socketLB"] != "all"
			if err := deploy.CheckLeastPrivilege(ctx, c.Client, tc.namespace, tc.serviceAccount, perPod); err != nil {
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
	for _, key := range []string{"PodMonitor/kpr-canary", "PrometheusRule/kpr-canary", "ConfigMap/kpr-canary-dashboard"} {
		if objs[key] == nil {
			t.Errorf("monitoring: no %s in %v", key, kinds(mapsValues(objs)))
		}
	}
	if l := objs["PodMonitor/kpr-canary"].GetLabels(); l["release"] != "kube-prometheus-stack" {
		t.Errorf("the PodMonitor's labels %v lack monitoring.podMonitor.labels", l)
	}
	kpr := container(t, ds, "containers", "kpr")
	args, _, _ := unstructured.NestedStringSlice(kpr, "args")
	for _, want := range []string{"--mode=iptables", "--fallback-mode=nftables", "--external-ips=node-local", "--lb-algorithm=maglev",
		"--maglev-hash-seed=$(KPR_MAGLEV_HASH_SEED)", "--log-level=debug", "--devices=eth0,bond0",
		"--socket-lb=per-pod", "--socket-lb-sandbox-handlers=kata*,my-vm", "--map-size-services=524288",
		"--map-size-conntrack=262144", "--healthcheck-bind-ip=10.0.0.20"} {
		if !slices.Contains(args, want) {
			t.Errorf("kpr's args %v lack %s", args, want)
		}
	}
	if last := args[len(args)-1]; last != "--healthcheck-bind-ip=10.0.0.20" {
		t.Errorf("kpr's args end with %s, not extraArgs: the chart's own flags would override them", last)
	}
	flagsKnown(t, "run", args)
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--map-size-backends") }) {
		t.Errorf("kpr's args %v size the backend map, which the values leave at 0 (kpr's default)", args)
	}
	env := fmt.Sprint(kpr["env"])
	for _, want := range []string{"name:GOMEMLIMIT value:400MiB", "name:KPR_MAGLEV_HASH_SEED valueFrom:map[secretKeyRef:map[key:seed name:kpr-maglev-seed]]"} {
		if !strings.Contains(env, want) {
			t.Errorf("kpr's env %s lacks %s", env, want)
		}
	}
	// The digest wins over the tag; the version label keeps the tag.
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if kpr["image"] != "registry.example.com/mirror/kpr@"+digest || kpr["imagePullPolicy"] != "Always" {
		t.Errorf("image %v, pull policy %v", kpr["image"], kpr["imagePullPolicy"])
	}
	if v := ds.GetLabels()["app.kubernetes.io/version"]; v != "v0.1.1" {
		t.Errorf("version label %q, want the tag v0.1.1", v)
	}
	if mem, _, _ := unstructured.NestedString(kpr, "resources", "limits", "memory"); mem != "512Mi" {
		t.Errorf("memory limit %q, want 512Mi", mem)
	}
	if port, _, _ := unstructured.NestedSlice(kpr, "ports"); len(port) != 2 || fmt.Sprint(port[0].(map[string]any)["containerPort"]) != "10266" {
		t.Errorf("ports %v, want the healthz port 10266 of config.healthzBindAddress and the PodMonitor's metrics port", port)
	}
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	if sel, _ := spec["nodeSelector"].(map[string]any); sel["kpr.io/proxy"] != "kpr" || sel["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v, want the values file's merged with the default kubernetes.io/os", sel)
	}
	if !strings.Contains(fmt.Sprint(spec["affinity"]), "node-role.kubernetes.io/edge") {
		t.Errorf("affinity %v lacks the values file's", spec["affinity"])
	}
	if fmt.Sprint(spec["imagePullSecrets"]) != "[map[name:mirror-credentials]]" {
		t.Errorf("imagePullSecrets %v", spec["imagePullSecrets"])
	}
	if spec["dnsPolicy"] != "Default" {
		t.Errorf("dnsPolicy %v, want Default: the cluster DNS is a Service only kpr makes reachable", spec["dnsPolicy"])
	}
	if ds.GetAnnotations()["example.com/owner"] != "network-team" || ds.GetLabels()["example.com/tier"] != "node" {
		t.Errorf("the DaemonSet's metadata %v %v lacks daemonSetAnnotations or daemonSetLabels", ds.GetAnnotations(), ds.GetLabels())
	}
	tmpl, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "metadata")
	if !strings.Contains(fmt.Sprint(tmpl), "example.com/scrape:false") || !strings.Contains(fmt.Sprint(tmpl), "example.com/tier:node") ||
		!strings.Contains(fmt.Sprint(tmpl), "checksum/config:") {
		t.Errorf("the Pod template's metadata %v lacks podAnnotations, podLabels or the checksum", tmpl)
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
	if cfg["mode"] != "ipvs" || cfg["kind"] != "KubeProxyConfiguration" || !reflect.DeepEqual(cfg["nodePortAddresses"], []any{"primary"}) ||
		ipt["syncPeriod"] != "1m" || ipt["minSyncPeriod"] != "1s" {
		t.Errorf("config.conf has the values file's settings merged over the defaults wrongly:\n%s", conf)
	}
}

// checkCleanup checks that cleanup.enabled replaces kpr's DaemonSet by
// the cleanup one, which removes the tc programs from the devices kpr
// used, each value one argument that no shell parses: the script is the
// same whatever the values.
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
	if want := `--devices=eth0,bond0";touch /tmp/kpr-quoted`; !slices.Contains(args, want) {
		t.Errorf("cleanup args %q lack %q", args, want)
	}
	flagsKnown(t, "cleanup", args)
	command, _, _ := unstructured.NestedStringSlice(cleanup, "command")
	defaults := byKind(renderChart(t, deploy.Namespace, map[string]any{"cleanup": map[string]any{"enabled": true}}, oldestKube))
	want, _, _ := unstructured.NestedStringSlice(container(t, defaults["DaemonSet/kpr-cleanup"], "initContainers", "cleanup"), "command")
	if !slices.Equal(command, want) || strings.Contains(strings.Join(command, " "), "bond0") {
		t.Errorf("the cleanup's command depends on the values:\n%q\nwith the defaults:\n%q", command, want)
	}
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

// TestAppArmorByKubernetesVersion checks how the chart runs kpr
// Unconfined, as Cilium's chart runs its agent: from Kubernetes 1.30 on
// through the Pod's securityContext.appArmorProfile, before through the
// container.apparmor.security.beta.kubernetes.io annotation of each
// unprivileged container, which older API servers take instead. The
// SELinux type is spc_t either way.
func TestAppArmorByKubernetesVersion(t *testing.T) {
	for _, tc := range []struct {
		kube       *chartutil.KubeVersion
		field      bool
		cleanup    bool
		ds, target string
	}{
		{oldestKube, false, false, "DaemonSet/kpr", "kpr"},
		{baseKube, true, false, "DaemonSet/kpr", "kpr"},
		{oldestKube, false, true, "DaemonSet/kpr-cleanup", "cleanup"},
		{baseKube, true, true, "DaemonSet/kpr-cleanup", "cleanup"},
	} {
		t.Run(tc.kube.Version+" "+tc.ds, func(t *testing.T) {
			objs := byKind(renderChart(t, deploy.Namespace, map[string]any{"cleanup": map[string]any{"enabled": tc.cleanup}}, tc.kube))
			ds := objs[tc.ds]
			if ds == nil {
				t.Fatalf("no %s in %v", tc.ds, kinds(mapsValues(objs)))
			}
			profile, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "securityContext", "appArmorProfile", "type")
			annotations, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "annotations")
			annotation := annotations["container.apparmor.security.beta.kubernetes.io/"+tc.target]
			if tc.field && (profile != "Unconfined" || annotation != "") {
				t.Errorf("Kubernetes %s: appArmorProfile %q, annotation %q; want the field Unconfined alone", tc.kube.Version, profile, annotation)
			}
			if !tc.field && (profile != "" || annotation != "unconfined") {
				t.Errorf("Kubernetes %s: appArmorProfile %q, annotation %q; want the annotation unconfined alone", tc.kube.Version, profile, annotation)
			}
			list := "containers"
			if tc.cleanup {
				list = "initContainers"
			}
			se, _, _ := unstructured.NestedStringMap(container(t, ds, list, tc.target), "securityContext", "seLinuxOptions")
			if se["type"] != "spc_t" || se["level"] != "s0" {
				t.Errorf("%s's seLinuxOptions %v, want type spc_t, level s0", tc.target, se)
			}
		})
	}
}

// kpr's probes let it start on a busy node and keep it through a stall:
// a startup probe of minutes (kpr probes the kernel and verifies its
// programs before it serves /livez), then a liveness probe that needs a
// minute of failures, each given seconds. On the real test cluster the
// earlier probes (40 s to start, 1 s per answer) killed kpr on loaded
// nodes again and again, and new Services went unserved.
func TestProbesLetKprStartOnABusyNode(t *testing.T) {
	ds := byKind(renderChart(t, "kpr-system", nil, nil))["DaemonSet/kpr"]
	kpr := container(t, ds, "containers", "kpr")
	seconds := func(probe, field string, def int64) int64 {
		v, found, err := unstructured.NestedFieldNoCopy(kpr, probe, field)
		if err != nil {
			t.Fatalf("%s.%s: %v", probe, field, err)
		}
		if !found {
			return def // Kubernetes' default
		}
		n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		if err != nil {
			t.Fatalf("%s.%s: %v is not a number of seconds", probe, field, v)
		}
		return n
	}
	if _, ok := kpr["startupProbe"]; !ok {
		t.Fatal("the kpr container has no startupProbe: the liveness probe runs from its start")
	}
	if got := seconds("startupProbe", "periodSeconds", 10) * seconds("startupProbe", "failureThreshold", 3); got < 180 {
		t.Errorf("the startup probe gives kpr %d s to start, want at least 180", got)
	}
	for _, probe := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
		if got := seconds(probe, "timeoutSeconds", 1); got < 5 {
			t.Errorf("%s: %d s to answer, want at least 5", probe, got)
		}
	}
	if got := seconds("livenessProbe", "periodSeconds", 10) * seconds("livenessProbe", "failureThreshold", 3); got < 60 {
		t.Errorf("the liveness probe kills kpr after %d s of failures, want at least 60", got)
	}
}
