// Package kustomize renders deploy/base and deploy/cleanup with kustomize's
// Go library, as `kubectl apply -k` does, and checks the result against a
// real API server.
package kustomize

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/deploy"
)

func render(t *testing.T, dir string) []byte {
	t.Helper()
	return renderIn(t, filesys.MakeFsOnDisk(), dir)
}

// renderIn is `kustomize build dir` on the file system fs.
func renderIn(t *testing.T, fs filesys.FileSystem, dir string) []byte {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBaseRendersAndPassesADryRun(t *testing.T) {
	objs, err := deploy.Parse(render(t, deploy.BaseDir()))
	if err != nil {
		t.Fatal(err)
	}
	// The cleanup DaemonSet goes into the base's namespace, which the
	// dry run below creates.
	cleanup, err := deploy.Parse(render(t, deploy.CleanupDir()))
	if err != nil {
		t.Fatal(err)
	}
	if len(cleanup) != 1 || cleanup[0].GetKind() != "DaemonSet" {
		t.Errorf("deploy/cleanup renders %d objects, want its DaemonSet", len(cleanup))
	}
	objs = append(objs, cleanup...)
	images := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "Namespace" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" && o.GetNamespace() != deploy.Namespace {
			t.Errorf("%s %s is in namespace %q, want %s", o.GetKind(), o.GetName(), o.GetNamespace(), deploy.Namespace)
		}
		if o.GetLabels()["app.kubernetes.io/name"] != "kpr" {
			t.Errorf("%s %s lacks the app.kubernetes.io/name label", o.GetKind(), o.GetName())
		}
		if o.GetKind() == "DaemonSet" {
			for _, path := range [][]string{{"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "initContainers"}} {
				cs := objectsAt(o.Object, path...)
				for _, c := range cs {
					images[c["image"].(string)] = true
				}
			}
		}
	}
	if len(images) != 1 || !images["ghcr.io/kpr-io/kpr:v0.1.0"] {
		t.Errorf("images %v, want one, pinned by version", images)
	}

	c := cluster.StartForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := deploy.NewApplier(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DryRunAll(ctx, objs); err != nil {
		t.Fatal(err)
	}
}

// objectsAt returns the list of objects at path in obj.
func objectsAt(obj map[string]any, path ...string) []map[string]any {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	list, _ := cur.([]any)
	out := make([]map[string]any, 0, len(list))
	for _, item := range list {
		if m, ok := item.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// TestBaseConfigChangeRollsTheDaemonSet checks that the base's ConfigMaps
// are named after their content, with the DaemonSet referring to those
// names: a changed config.conf (or API server address) is then a changed
// Pod template, and `kubectl apply -k` rolls the DaemonSet node by node,
// as the chart's checksum annotations do.
func TestBaseConfigChangeRollsTheDaemonSet(t *testing.T) {
	refs := func(fs filesys.FileSystem) (configMaps []string, daemonSet string) {
		t.Helper()
		objs, err := deploy.Parse(renderIn(t, fs, "/base"))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			switch o.GetKind() {
			case "ConfigMap":
				configMaps = append(configMaps, o.GetName())
			case "DaemonSet":
				spec, _ := json.Marshal(o.Object["spec"])
				daemonSet = string(spec)
			}
		}
		return configMaps, daemonSet
	}
	// The base, copied into memory, before and after a change.
	fs := filesys.MakeFsInMemory()
	entries, err := os.ReadDir(deploy.BaseDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(deploy.BaseDir(), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile("/base/"+e.Name(), data); err != nil {
			t.Fatal(err)
		}
	}
	before, dsBefore := refs(fs)
	if len(before) != 2 {
		t.Fatalf("the base has ConfigMaps %v, want kpr-config and kpr-apiserver", before)
	}
	for _, name := range before {
		if !strings.HasPrefix(name, "kpr-config-") && !strings.HasPrefix(name, "kpr-apiserver-") {
			t.Errorf("ConfigMap %s is not named after its content (configMapGenerator)", name)
		}
		if !strings.Contains(dsBefore, `"`+name+`"`) {
			t.Errorf("the DaemonSet does not refer to ConfigMap %s by its generated name", name)
		}
	}
	conf, err := fs.ReadFile("/base/config.conf")
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(conf), "syncPeriod: 30s", "syncPeriod: 1m", 1)
	if changed == string(conf) {
		t.Fatal("config.conf has no syncPeriod: 30s to change")
	}
	if err := fs.WriteFile("/base/config.conf", []byte(changed)); err != nil {
		t.Fatal(err)
	}
	after, dsAfter := refs(fs)
	for _, name := range after {
		if strings.HasPrefix(name, "kpr-config-") && slices.Contains(before, name) {
			t.Errorf("config.conf changed and ConfigMap %s kept its name: the DaemonSet would not roll", name)
		}
	}
	if dsAfter == dsBefore {
		t.Error("config.conf changed and the DaemonSet's spec did not: it would not roll")
	}
}
