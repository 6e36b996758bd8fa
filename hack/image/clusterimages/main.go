// Command clusterimages writes the archives of the test cluster's images
// (images.go) for hack/cluster-images.sh (`make cluster-images`): each an
// OCI image layout in a tar, the image named with each of its references,
// made of the file tree the script built for it and the binaries it takes
// from the cluster tools directory. It also writes IMAGES, a line for each
// archive: its file name and the references it carries.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kpr-io/kpr/hack/image/oci"
)

func main() {
	rootfs := flag.String("rootfs", "", "directory of the images' file trees, one per image name (hack/cluster-images.sh)")
	tools := flag.String("tools", "", "directory of the binaries pause, coredns and agnhost")
	out := flag.String("o", "", "directory the archives go to")
	flag.Parse()
	if *rootfs == "" || *tools == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: clusterimages -rootfs DIR -tools DIR -o DIR (hack/cluster-images.sh sets them)")
		os.Exit(2)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "clusterimages: %v\n", err)
		os.Exit(1)
	}
	var list strings.Builder
	for _, s := range Images {
		archive := s.Name + ".tar"
		if err := build(s, *rootfs, *tools, filepath.Join(*out, archive)); err != nil {
			fmt.Fprintf(os.Stderr, "clusterimages: %s: %v\n", s.Name, err)
			os.Exit(1)
		}
		fmt.Fprintf(&list, "%s %s\n", archive, strings.Join(s.Refs, " "))
		fmt.Fprintf(os.Stderr, "clusterimages: wrote %s (%s)\n", archive, strings.Join(s.Refs, ", "))
	}
	if err := os.WriteFile(filepath.Join(*out, "IMAGES"), []byte(list.String()), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "clusterimages: %v\n", err)
		os.Exit(1)
	}
}

// build writes the archive of s: the file tree, then the binaries.
func build(s Spec, rootfs, tools, out string) error {
	var refs []name.Reference
	for _, r := range s.Refs {
		ref, err := name.ParseReference(r, name.StrictValidation)
		if err != nil {
			return err
		}
		refs = append(refs, ref)
	}
	var layers [][]byte
	dir := filepath.Join(rootfs, s.Name)
	if entries, err := os.ReadDir(dir); err != nil {
		return err
	} else if len(entries) > 0 {
		// pause's tree is empty: its one layer is the binary's.
		tree, err := oci.TreeTar(dir)
		if err != nil {
			return fmt.Errorf("file tree: %w", err)
		}
		layers = append(layers, tree)
	}
	if len(s.Binaries) > 0 {
		var files []oci.File
		for _, b := range s.Binaries {
			files = append(files, oci.File{Src: filepath.Join(tools, b.Tool), Dst: b.Dst})
		}
		bin, err := oci.FilesTar(files...)
		if err != nil {
			return fmt.Errorf("binaries: %w", err)
		}
		layers = append(layers, bin)
	}
	img, err := oci.Image(layers, s.Config)
	if err != nil {
		return err
	}
	return oci.WriteArchive(img, refs, out)
}
