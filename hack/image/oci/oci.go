// Package oci writes container images without a container daemon, for
// kpr's image (hack/image) and the test cluster's images
// (hack/image/clusterimages): layers from file trees and single files, every
// file root's and dated Epoch, an image of those layers, and an archive of
// it, an OCI image layout in a tar, that `ctr images import`, `skopeo copy
// oci-archive:…`, `podman load` and `docker load` read. The same inputs give
// the same bytes, so the same image digest.
package oci

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is every file's and every image's time, so that the same inputs
// give the same image digest.
var Epoch = time.Unix(0, 0).UTC()

// Image is an image of this machine's architecture made of layers (each an
// uncompressed tar, the lowest first) with the run configuration c, created
// at Epoch.
func Image(layers [][]byte, c v1.Config) (v1.Image, error) {
	var ls []v1.Layer
	for _, b := range layers {
		// Compressed once: the layout's writer asks for the digest and
		// then for the bytes.
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, ls...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: Epoch}
	cf.Config = c
	return mutate.ConfigFile(img, cf)
}

// WriteArchive writes img as an OCI image layout and tars it into out, the
// image named once for each of refs (at least one). The index names it
// twice each time: ref.name (the OCI annotation, the tag) for skopeo and
// podman, io.containerd.image.name (the whole reference) for docker and
// containerd, whose `ctr images import` makes one image of each entry.
func WriteArchive(img v1.Image, refs []name.Reference, out string) error {
	if len(refs) == 0 {
		return fmt.Errorf("%s: no image reference", out)
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".kpr-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	for _, ref := range refs {
		err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref.Identifier(),
			"io.containerd.image.name":          ref.Name(),
		}))
		if err != nil {
			return fmt.Errorf("write OCI layout: %w", err)
		}
	}
	data, err := TreeTar(dir)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// TreeTar tars the tree under root as the root of the archive, every file
// owned by root: dpkg-deb -x run by a user leaves the user's ownership, and
// the packages' files are root's. Hard links (none in the packages taken)
// would be stored as copies.
func TreeTar(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if d.Type()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		return writeEntry(tw, hdr, p)
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// File is a file of a FilesTar layer: the file Src on this machine, as the
// executable Dst (an absolute path) in the image.
type File struct {
	Src, Dst string
}

// FilesTar is a layer of files, and the directories above them.
func FilesTar(files ...File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		info, err := os.Stat(f.Src)
		if err != nil {
			return nil, err
		}
		if !info.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is no regular file", f.Src)
		}
		parts := strings.Split(strings.Trim(f.Dst, "/"), "/")
		for i := 1; i < len(parts); i++ {
			dir := strings.Join(parts[:i], "/") + "/"
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			if err := writeEntry(tw, &tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}, ""); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.Trim(f.Dst, "/"), Mode: 0o755, Size: info.Size()}
		if err := writeEntry(tw, hdr, f.Src); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Src, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeEntry writes hdr, normalised (root's, at Epoch), and for a regular
// file the contents of src.
func writeEntry(tw *tar.Writer, hdr *tar.Header, src string) error {
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = Epoch, time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(tw, f)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%s changed size while read", src)
	}
	return err
}
