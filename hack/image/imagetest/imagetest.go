// Package imagetest holds what the image tests share (hack/image's and
// hack/image/clusterimages'): unpacking an archive the way a runtime reads
// it, finding the files of the image's tree, checking that a program finds
// its libraries in it, and running programs in a chroot of it.
package imagetest

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Path is the PATH the chroot runs programs with.
const Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Archive is an OCI layout archive, unpacked.
type Archive struct {
	// Names are the entries' io.containerd.image.name annotations, the
	// whole references containerd and docker name the image by; Tags
	// their org.opencontainers.image.ref.name ones.
	Names, Tags []string
	// Image is the image every entry names.
	Image v1.Image
}

// Open unpacks the OCI layout archive into dir and returns its image, after
// checking that every entry of the index is the same image.
func Open(t *testing.T, archive, dir string) Archive {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Untar(tar.NewReader(f), dir); err != nil {
		t.Fatalf("unpack %s: %v", archive, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s is no OCI image layout: %v", archive, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) == 0 {
		t.Fatalf("%s: index has no manifests", archive)
	}
	var a Archive
	for _, d := range m.Manifests {
		if d.Digest != m.Manifests[0].Digest {
			t.Errorf("%s: index entries name different images, %s and %s", archive, d.Digest, m.Manifests[0].Digest)
		}
		a.Names = append(a.Names, d.Annotations["io.containerd.image.name"])
		a.Tags = append(a.Tags, d.Annotations["org.opencontainers.image.ref.name"])
	}
	if a.Image, err = idx.Image(m.Manifests[0].Digest); err != nil {
		t.Fatal(err)
	}
	return a
}

// Extract writes the image's flattened file tree into dir.
func Extract(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := Untar(tar.NewReader(rc), dir); err != nil {
		t.Fatalf("extract the image: %v", err)
	}
}

// Untar writes the archive's files under dir; a later entry replaces an
// earlier one of the same name (a file of a higher layer), except that a
// directory stays.
func Untar(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Name)))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeDir {
			if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
				if err := os.Remove(p); err != nil {
					return err
				}
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, h.FileInfo().Mode().Perm()|0o700)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, h.FileInfo().Mode().Perm()); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		default:
			err = errors.New("unexpected tar entry type " + string(h.Typeflag) + " for " + h.Name)
		}
		if err != nil {
			return err
		}
	}
}

// Inside resolves p, an absolute path in the image's tree at root, to the
// host path of the file it names, following symlinks as they resolve in
// the image.
func Inside(t *testing.T, root, p string) string {
	t.Helper()
	for hops := 0; hops < 40; hops++ {
		// Resolve the directories first, then the last element.
		dir, base := path.Split(path.Clean(p))
		if dir != "/" {
			dir = strings.TrimPrefix(Inside(t, root, dir), root)
		}
		p = path.Join(dir, base)
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return filepath.Join(root, p)
		}
		if !path.IsAbs(target) {
			target = path.Join(dir, target)
		}
		p = target
	}
	t.Fatalf("%s: too many symlinks", p)
	return ""
}

// CheckELF checks that the program at p exists in the image, and that its
// interpreter and every library it needs, and theirs, are in the image's
// library directories.
func CheckELF(t *testing.T, root, p string) {
	t.Helper()
	f, err := elf.Open(Inside(t, root, p))
	if err != nil {
		t.Errorf("%s in the image: %v", p, err)
		return
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, _ := io.ReadAll(prog.Open())
		interp := strings.TrimRight(string(b), "\x00")
		if _, err := os.Stat(Inside(t, root, interp)); err != nil {
			t.Errorf("%s: interpreter %s not in the image", p, interp)
		}
	}
	libDirs, _ := filepath.Glob(filepath.Join(root, "usr/lib/*-linux-gnu"))
	libDirs = append(libDirs, filepath.Join(root, "usr/lib"))
	seen := map[string]bool{}
	var walk func(string, *elf.File)
	walk = func(who string, f *elf.File) {
		libs, err := f.ImportedLibraries()
		if err != nil {
			t.Errorf("%s: %v", who, err)
			return
		}
		for _, lib := range libs {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			found := false
			for _, d := range libDirs {
				lf, err := elf.Open(filepath.Join(d, lib))
				if err != nil {
					continue
				}
				found = true
				walk(lib, lf)
				lf.Close()
				break
			}
			if !found {
				t.Errorf("%s needs %s (for %s), which the image lacks", who, lib, p)
			}
		}
	}
	walk(p, f)
}

// Chroot runs argv in the image's file tree, in a mount namespace of its own
// with /proc, /sys and /dev, and returns its output; a failure is the test's.
func Chroot(t *testing.T, root string, argv ...string) string {
	t.Helper()
	out, err := Run(root, false, argv...)
	if err != nil {
		t.Errorf("%q in the image: %v\n%s", argv, err, out)
	}
	return out
}

// ChrootNet is Chroot in a network namespace of its own as well (its
// loopback up), for servers.
func ChrootNet(t *testing.T, root string, argv ...string) string {
	t.Helper()
	out, err := Run(root, true, argv...)
	if err != nil {
		t.Errorf("%q in the image, own network: %v\n%s", argv, err, out)
	}
	return out
}

// Run runs argv as Chroot does, or as ChrootNet does if net, and returns its
// output and how it ended.
func Run(root string, net bool, argv ...string) (string, error) {
	script := `set -e; r=$1; shift
mkdir -p "$r/proc" "$r/sys" "$r/dev"
mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"; mount --rbind /dev "$r/dev"
exec chroot "$r" "$@"`
	args := []string{"--mount", "--propagation", "private"}
	if net {
		// A new network namespace's loopback is down: the host's ip
		// brings it up before the chroot. A PID namespace of its own
		// ends the servers that argv leaves running when argv ends.
		args = append(args, "--net", "--pid", "--fork")
		script = "ip link set lo up; " + script
	}
	cmd := exec.Command("unshare", append(append(args, "--", "/bin/sh", "-c", script, "sh", root), argv...)...)
	cmd.Env = []string{"PATH=" + Path}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
