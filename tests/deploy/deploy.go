// Package deploy reads the manifests of deploy/ and creates them on a test
// API server, so that their tests (tests/e2e's, and the kustomize and Helm
// renderings' in the modules under kustomize/ and helm/) check them alike: created
// through the dynamic client with strict field validation, so a misspelt
// or misplaced field fails as the API server's schema says.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Where deploy/base puts kpr.
const (
	Namespace      = "kpr-system"
	ServiceAccount = "kpr"
)

// BaseDir is the kustomize base's directory in this repository.
func BaseDir() string { return repoDir("deploy", "base") }

// CleanupDir is the kustomization of the cleanup DaemonSet.
func CleanupDir() string { return repoDir("deploy", "cleanup") }

// ChartDir is the Helm chart's directory.
func ChartDir() string { return repoDir("deploy", "helm", "kpr") }

// repoDir is the directory at path under the repository's root.
func repoDir(path ...string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", ".."}, path...)...)
}

// ReadFile returns the objects of a YAML file, in order.
func ReadFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// Parse returns the objects of a multi-document YAML stream, in order.
func Parse(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// Applier creates objects of any kind the API server serves.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier returns an Applier that acts with cfg's credentials.
func NewApplier(cfg *rest.Config) (*Applier, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}, nil
}

// Create creates u, or with dryRun has the API server check it all the
// way (dryRun=All: admission and validation, nothing stored).
func (a *Applier) Create(ctx context.Context, u *unstructured.Unstructured, dryRun bool) error {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk, u.GetName(), err)
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var r dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		r = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	if _, err := r.Create(ctx, u, opts); err != nil {
		return fmt.Errorf("create %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// DryRunAll creates the Namespaces among objs for real (a dry run of the
// objects in a namespace needs it to exist) after a dry run of each, then
// dry-runs every other object. It returns one error per object refused.
func (a *Applier) DryRunAll(ctx context.Context, objs []*unstructured.Unstructured) error {
	var errs []error
	for _, o := range objs {
		if o.GetKind() != "Namespace" {
			continue
		}
		if err := a.Create(ctx, o, true); err != nil {
			errs = append(errs, err)
		} else if err := a.Create(ctx, o, false); err != nil {
			errs = append(errs, err)
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		if err := a.Create(ctx, o, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
