// Package kustomize renders deploy/base and deploy/cleanup with kustomize's
// Go library, as `kubectl apply -k` does, and checks the result against a
// real API server.
package kustomize

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/deploy"
)

func render(t *testing.T, dir string) []byte {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
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
