// Command image builds kpr's container image without a container daemon
// (`make image`): an OCI image of two layers, the runtime file tree that
// hack/image-rootfs.sh extracts from Debian packages and the kpr binary at
// /usr/local/bin/kpr, written as an OCI image layout in a tar archive
// ("oci-archive", what `skopeo copy oci-archive:…`, `podman load` and
// `docker load` read).
//
// It is a module of its own so that go-containerregistry stays out of kpr's
// product go.mod, as the test tools do (tests/tools).
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	var o Options
	flag.StringVar(&o.Rootfs, "rootfs", "", "runtime file tree (hack/image-rootfs.sh)")
	flag.StringVar(&o.Binary, "kpr", "", "the kpr binary (make build)")
	flag.StringVar(&o.Version, "version", "", "the version the binary was stamped with; the image's version label")
	flag.StringVar(&o.Ref, "ref", "", "image reference recorded in the archive, e.g. ghcr.io/kpr-io/kpr:v0.1.0")
	flag.StringVar(&o.Out, "o", "", "output archive (OCI layout in a tar)")
	flag.Parse()
	if o.Rootfs == "" || o.Binary == "" || o.Version == "" || o.Ref == "" || o.Out == "" {
		fmt.Fprintln(os.Stderr, "usage: image -rootfs DIR -kpr FILE -version V -ref REF -o ARCHIVE (make image sets them)")
		os.Exit(2)
	}
	if err := Build(o); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "image: wrote %s (%s)\n", o.Out, o.Ref)
}
