package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/maps/maglev"
)

// apiServing answers GET /api/v1/namespaces/kube-system with status and
// body, as JSON.
func apiServing(t *testing.T, status int, body string) rest.Interface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/kube-system" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	c, err := apiclient.ForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeJSON}})
	if err != nil {
		t.Fatal(err)
	}
	return c.Core
}

const kubeSystem = `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"kube-system","uid":"%s"}}`

// Without --maglev-hash-seed the seed is the kube-system Namespace's UID:
// the same on every node of a cluster, another in another cluster. The
// flag wins over it; random needs neither.
func TestMaglevSeedFromTheClusterOrTheFlag(t *testing.T) {
	seedOf := func(f ebpfFlags, core rest.Interface) uint64 {
		t.Helper()
		if err := f.resolveMaglevSeed(context.Background(), core, zap.NewNop()); err != nil {
			t.Fatal(err)
		}
		return f.maglevSeed
	}
	uid := func(u string) rest.Interface {
		return apiServing(t, http.StatusOK, strings.Replace(kubeSystem, "%s", u, 1))
	}
	cluster1 := uid("5b2d1c9e-8f3a-4d7e-9a61-0c4f2b7e1d35")
	node1 := seedOf(ebpfFlags{lbAlgorithm: lbMaglev}, cluster1)
	node2 := seedOf(ebpfFlags{lbAlgorithm: lbMaglev}, uid("5b2d1c9e-8f3a-4d7e-9a61-0c4f2b7e1d35"))
	other := seedOf(ebpfFlags{lbAlgorithm: lbMaglev}, uid("a0d7e3f1-2b4c-4e8a-b1d2-9c8e7f6a5b43"))
	if node1 == 0 || node1 != node2 {
		t.Errorf("two nodes of one cluster got seeds %#x and %#x", node1, node2)
	}
	if other == node1 {
		t.Errorf("another cluster got the same seed %#x", other)
	}
	flag := seedOf(ebpfFlags{lbAlgorithm: lbMaglev, maglevHashSeed: "s3cret-of-the-cluster"}, apiServing(t, http.StatusForbidden, `{}`))
	if flag == 0 || flag == node1 || flag != maglev.SeedOf("s3cret-of-the-cluster") {
		t.Errorf("--maglev-hash-seed gave seed %#x", flag)
	}
	if s := seedOf(ebpfFlags{lbAlgorithm: lbRandom}, apiServing(t, http.StatusForbidden, `{}`)); s != 0 {
		t.Errorf("--lb-algorithm random got seed %#x", s)
	}
	opts, err := (&runFlags{ebpf: ebpfFlags{lbAlgorithm: lbMaglev, tcAttach: "auto", maglevTableSize: 16381, maglevSeed: node1,
		devices: []string{"eth0"}}}).tcOptions()
	if err != nil || opts.MaglevSeed != node1 {
		t.Errorf("the tc programs get seed %#x (%v), want %#x", opts.MaglevSeed, err, node1)
	}
}

// A seed that cannot be read stops kpr with an error that says what to
// grant or give: a node that guessed would pick other backends than its
// peers.
func TestMaglevSeedUnreadableIsAnError(t *testing.T) {
	forbidden := apiServing(t, http.StatusForbidden,
		`{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"Forbidden","code":403,"message":"namespaces \"kube-system\" is forbidden"}`)
	f := ebpfFlags{lbAlgorithm: lbMaglev}
	err := f.resolveMaglevSeed(context.Background(), forbidden, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "--maglev-hash-seed") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("error %v, want one naming the refusal and --maglev-hash-seed", err)
	}
	if f.maglevSeed != 0 {
		t.Errorf("seed %#x after the error", f.maglevSeed)
	}
}
