package main

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kpr-io/kpr/hack/image/oci"
)

// A node pulls an archive's image under the reference it was built with,
// and an alias's, through the paths containerd uses for a mirror with
// override_path: the registry's host, then the repository.
func TestServesArchivesUnderTheirReferences(t *testing.T) {
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "web.tar")
	ref, err := name.ParseReference("registry.k8s.io/e2e-test-images/nginx:1.27.0-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := oci.WriteArchive(img, []name.Reference{ref}, archive); err != nil {
		t.Fatal(err)
	}
	images, err := load([]string{archive}, []string{"nginx=registry.k8s.io/e2e-test-images/nginx:1.27.0-2"}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- serve(ctx, l, images, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"registry.k8s.io/e2e-test-images/nginx:1.27.0-2", "docker.io/library/nginx:latest"} {
		got := pull(t, l.Addr().String()+"/"+path)
		if d, err := got.Digest(); err != nil || d != want {
			t.Errorf("%s: digest %v (%v), want %v", path, d, err, want)
		}
	}
}

func pull(t *testing.T, ref string) v1.Image {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	return img
}
