package main

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kpr-io/kpr/hack/image/oci"
)

// Options are the inputs of Build.
type Options struct {
	Rootfs, Binary, Version, Ref, Out string
}

// The image's contract with deploy/ (the DaemonSet passes only args, and its
// init container runs /bin/sh) and with the Dockerfile, which sets the same.
const (
	BinaryPath = "/usr/local/bin/kpr"
	Path       = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

var Entrypoint = []string{"kpr"}

// Build writes the image archive of o: two layers, the runtime file tree
// and the kpr binary.
func Build(o Options) error {
	ref, err := name.ParseReference(o.Ref)
	if err != nil {
		return fmt.Errorf("-ref %q: %w", o.Ref, err)
	}
	runtimeTar, err := oci.TreeTar(o.Rootfs)
	if err != nil {
		return fmt.Errorf("runtime layer from %s: %w", o.Rootfs, err)
	}
	binTar, err := oci.FilesTar(oci.File{Src: o.Binary, Dst: BinaryPath})
	if err != nil {
		return fmt.Errorf("kpr layer from %s: %w", o.Binary, err)
	}
	img, err := oci.Image([][]byte{runtimeTar, binTar}, v1.Config{
		Entrypoint: Entrypoint,
		Env:        []string{"PATH=" + Path},
		WorkingDir: "/",
		Labels:     Labels(o.Version),
	})
	if err != nil {
		return err
	}
	return oci.WriteArchive(img, []name.Reference{ref}, o.Out)
}

// Labels are the image's OCI labels; the version is the one `kpr --version`
// prints.
func Labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "kpr",
		"org.opencontainers.image.description": "eBPF kube-proxy replacement",
		"org.opencontainers.image.source":      "https://github.com/kpr-io/kpr",
		"org.opencontainers.image.version":     version,
	}
}
