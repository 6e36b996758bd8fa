package oci

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// ReadArchive reads an archive WriteArchive wrote and returns its images
// by the references the index names them with (io.containerd.image.name).
// The archive is unpacked into dir, which must outlive the images: their
// layers are read from there.
func ReadArchive(path, dir string) (map[string]v1.Image, error) {
	if err := untar(path, dir); err != nil {
		return nil, fmt.Errorf("unpacking %s: %w", path, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI image layout: %w", path, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	images := map[string]v1.Image{}
	for _, d := range m.Manifests {
		ref := d.Annotations["io.containerd.image.name"]
		if ref == "" {
			continue
		}
		if _, err := name.ParseReference(ref); err != nil {
			return nil, fmt.Errorf("%s names an image %q: %w", path, ref, err)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		images[ref] = img
	}
	if len(images) == 0 {
		return nil, fmt.Errorf("%s names no image (no io.containerd.image.name annotation)", path)
	}
	return images, nil
}

// untar unpacks the regular files and directories of the tar at path into
// dir, refusing names that would leave it.
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.Clean("/"+hdr.Name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(filepath.Separator)) && target != filepath.Clean(dir) {
			return fmt.Errorf("%s: entry %q leaves the archive's root", path, hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.Create(target)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		}
	}
}
