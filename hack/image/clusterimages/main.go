// Command clusterimages writes the archives of the test cluster's images
// (images.go) for hack/cluster-images.sh (`make cluster-images`): each an
// OCI image layout in a tar, the image named with each of its references,
// made of its base image's layers, the file tree the script built for it and
// the binaries it takes from the tools directory. It also writes IMAGES, a line for each
// archive: its file name and the references it carries.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kpr-io/kpr/hack/image/oci"
)

func main() {
	rootfs := flag.String("rootfs", "", "directory of the images' file trees, one per image name (hack/cluster-images.sh)")
	tools := flag.String("tools", "", "directory of the binaries the images take (images.go's Binaries)")
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
	var layers layerSet
	for _, s := range Images {
		archive := s.Name + ".tar"
		if err := build(s, *rootfs, *tools, filepath.Join(*out, archive), &layers); err != nil {
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

// build writes the archive of s.
func build(s Spec, rootfs, tools, out string, l *layerSet) error {
	var refs []name.Reference
	for _, r := range s.Refs {
		ref, err := name.ParseReference(r, name.StrictValidation)
		if err != nil {
			return err
		}
		refs = append(refs, ref)
	}
	layers, err := l.of(s, rootfs, tools)
	if err != nil {
		return err
	}
	img, err := oci.Image(layers, s.Config)
	if err != nil {
		return err
	}
	return oci.WriteArchive(img, refs, out)
}

// layerSet makes the layers of a base image once: an image's Base's are its
// first ones.
type layerSet map[string][][]byte

// of is the layers of s: its Base's, its file tree's, its binaries'.
func (l *layerSet) of(s Spec, rootfs, tools string) ([][]byte, error) {
	if layers, ok := (*l)[s.Name]; ok {
		return layers, nil
	}
	var layers [][]byte
	if s.Base != "" {
		i := slices.IndexFunc(Images, func(b Spec) bool { return b.Name == s.Base })
		if i < 0 || Images[i].Name == s.Name {
			return nil, fmt.Errorf("base %q is no other image", s.Base)
		}
		base, err := l.of(Images[i], rootfs, tools)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", s.Base, err)
		}
		layers = append(layers, base...)
	}
	dir := filepath.Join(rootfs, s.Name)
	if entries, err := os.ReadDir(dir); err != nil {
		return nil, err
	} else if len(entries) > 0 {
		// pause's tree is empty: its one layer is the binary's.
		tree, err := oci.TreeTar(dir)
		if err != nil {
			return nil, fmt.Errorf("file tree: %w", err)
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
			return nil, fmt.Errorf("binaries: %w", err)
		}
		layers = append(layers, bin)
	}
	// Kept only for the images based on it: the rest are large.
	if slices.ContainsFunc(Images, func(o Spec) bool { return o.Base == s.Name }) {
		if *l == nil {
			*l = layerSet{}
		}
		(*l)[s.Name] = layers
	}
	return layers, nil
}
