// Command clusterregistry serves image archives (make image, make
// cluster-images) as an OCI registry, the one the real test cluster's
// nodes pull from (tests/realcluster). Each image is a repository named
// after its whole reference, registry host included: registry.k8s.io/pause
// at tag 3.10.2. containerd on the nodes mirrors registry.k8s.io,
// docker.io and ghcr.io to it with override_path, so a pod's image
// reference resolves here unchanged, and imagePullPolicy Always pulls too.
//
//	clusterregistry -listen 192.168.230.1:5000 [-alias NEW=EXISTING]... ARCHIVE...
//
// It serves from memory, read-only once loaded, until SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kpr-io/kpr/hack/image/oci"
)

type aliases []string

func (a *aliases) String() string     { return strings.Join(*a, ",") }
func (a *aliases) Set(s string) error { *a = append(*a, s); return nil }

func main() {
	listen := flag.String("listen", "127.0.0.1:5000", "address to serve the registry on")
	var alias aliases
	flag.Var(&alias, "alias", "NEW=EXISTING: serve the image EXISTING also as NEW (repeatable)")
	flag.Parse()
	if err := run(*listen, alias, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "clusterregistry:", err)
		os.Exit(1)
	}
}

func run(listen string, alias []string, archives []string) error {
	tmp, err := os.MkdirTemp("", "clusterregistry-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	images, err := load(archives, alias, tmp)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, l, images, func() { fmt.Printf("ready: %d images on %s\n", len(images), l.Addr()) })
}

// load reads the archives (unpacked under tmp) and adds the aliases: the
// images to serve, by normalized reference.
func load(archives, alias []string, tmp string) (map[string]v1.Image, error) {
	images := map[string]v1.Image{}
	for i, a := range archives {
		got, err := oci.ReadArchive(a, fmt.Sprintf("%s/%d", tmp, i))
		if err != nil {
			return nil, err
		}
		for ref, img := range got {
			images[normalize(ref)] = img
		}
	}
	for _, a := range alias {
		newRef, existing, ok := strings.Cut(a, "=")
		img := images[normalize(existing)]
		if !ok || img == nil {
			return nil, fmt.Errorf("-alias %q: want NEW=EXISTING, EXISTING one of the archives' images", a)
		}
		images[normalize(newRef)] = img
	}
	return images, nil
}

// serve serves images on l until ctx ends, calling ready once they are
// all in.
func serve(ctx context.Context, l net.Listener, images map[string]v1.Image, ready func()) error {
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(os.Stderr, "registry: ", log.LstdFlags)))}
	go srv.Serve(l)
	// The in-memory registry is filled through its own API.
	self := l.Addr().String()
	for ref, img := range images {
		r, err := name.ParseReference(ref)
		if err != nil {
			return err
		}
		dst, err := name.ParseReference(self+"/"+repository(r)+":"+r.Identifier(), name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.Write(dst, img); err != nil {
			return fmt.Errorf("loading %s: %w", ref, err)
		}
	}
	ready()
	<-ctx.Done()
	return srv.Shutdown(context.Background())
}

// normalize spells a reference out in full (nginx is
// docker.io/library/nginx:latest), as containerd asks for it.
func normalize(ref string) string {
	r, err := name.ParseReference(ref)
	if err != nil {
		return ref
	}
	return repository(r) + ":" + r.Identifier()
}

// repository is where this registry keeps r's image: the path containerd
// asks a mirror with override_path for, the registry's host as containerd
// names it (docker.io, not go-containerregistry's index.docker.io) and the
// repository.
func repository(r name.Reference) string {
	host := r.Context().RegistryStr()
	if host == name.DefaultRegistry {
		host = "docker.io"
	}
	return host + "/" + r.Context().RepositoryStr()
}
