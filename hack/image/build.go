package main

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

// epoch is every file's and the image's time, so that the same inputs give
// the same image digest.
var epoch = time.Unix(0, 0).UTC()

// Build writes the image archive of o.
func Build(o Options) error {
	ref, err := name.ParseReference(o.Ref)
	if err != nil {
		return fmt.Errorf("-ref %q: %w", o.Ref, err)
	}
	runtimeTar, err := treeTar(o.Rootfs)
	if err != nil {
		return fmt.Errorf("runtime layer from %s: %w", o.Rootfs, err)
	}
	binTar, err := fileTar(o.Binary, BinaryPath)
	if err != nil {
		return fmt.Errorf("kpr layer from %s: %w", o.Binary, err)
	}
	var layers []v1.Layer
	for _, b := range [][]byte{runtimeTar, binTar} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return err
		}
		layers = append(layers, l)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layers...); err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = Entrypoint
	cf.Config.Env = []string{"PATH=" + Path}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = Labels(o.Version)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	return writeArchive(img, ref, o.Out)
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

// writeArchive writes img as an OCI image layout and tars it into out. The
// index names the image twice: ref.name (the OCI annotation, the tag) for
// skopeo and podman, io.containerd.image.name (the whole reference) for
// docker and containerd.
func writeArchive(img v1.Image, ref name.Reference, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".kpr-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.Identifier(),
		"io.containerd.image.name":          ref.Name(),
	}))
	if err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	data, err := treeTar(dir)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// treeTar tars the tree under root as the root of the archive, every file
// owned by root: dpkg-deb -x run by a user leaves the user's ownership, and
// the packages' files are root's. Hard links (none in the packages kpr
// takes) would be stored as copies.
func treeTar(root string) ([]byte, error) {
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

// fileTar is a layer with the one file src at dst (an absolute path), and
// the directories above it.
func fileTar(src, dst string) ([]byte, error) {
	info, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	parts := strings.Split(strings.Trim(dst, "/"), "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/") + "/"
		if err := writeEntry(tw, &tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}, ""); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.Trim(dst, "/"), Mode: 0o755, Size: info.Size()}
	if err := writeEntry(tw, hdr, src); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeEntry writes hdr, normalised (root's, at epoch), and for a regular
// file the contents of src.
func writeEntry(tw *tar.Writer, hdr *tar.Header, src string) error {
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
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
	_, err = io.Copy(tw, f)
	return err
}
