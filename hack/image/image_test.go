package main

import (
	"archive/tar"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

const testVersion = "v0.0.0-imagetest"

// TestImage runs `make image` as a user would, then checks the archive: the
// image's entrypoint, version label and files, that every binary the
// fallback modes run finds its libraries inside the image, and, as root,
// that the binaries run in a chroot of the image's file tree.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image (downloads Debian packages on first use)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	archive := filepath.Join(tmp, "kpr-image.tar")
	mk := exec.Command("make", "-C", root, "--no-print-directory", "image", "VERSION="+testVersion,
		"KPR_BIN="+filepath.Join(tmp, "kpr"), "IMAGE_ROOTFS="+filepath.Join(tmp, "rootfs"), "IMAGE_ARCHIVE="+archive)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}

	img := openArchive(t, archive, filepath.Join(tmp, "layout"))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"kpr"}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [kpr] and none: deploy/'s DaemonSet passes only args", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if !slices.Contains(cf.Config.Env, "PATH="+Path) {
		t.Errorf("env %q lacks PATH=%s, which finds kpr and the iptables tools", cf.Config.Env, Path)
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != testVersion {
		t.Errorf("version label %q, want %q", v, testVersion)
	}

	fsDir := filepath.Join(tmp, "fs")
	extract(t, img, fsDir)
	// What the modes run (iptables-compat runs the variant's -save and
	// -restore, and `iptables --version`), and what the init container runs.
	tools := []string{
		BinaryPath,
		"/usr/sbin/iptables", "/usr/sbin/iptables-nft", "/usr/sbin/iptables-legacy",
		"/usr/sbin/iptables-nft-save", "/usr/sbin/iptables-nft-restore",
		"/usr/sbin/iptables-legacy-save", "/usr/sbin/iptables-legacy-restore",
		"/usr/sbin/ip6tables-nft-restore", "/usr/sbin/ip6tables-legacy-restore",
		"/usr/sbin/ipset", "/usr/sbin/conntrack",
		"/bin/sh", "/bin/mount", "/bin/mountpoint",
	}
	for _, f := range tools {
		t.Run(strings.TrimPrefix(f, "/"), func(t *testing.T) { checkELF(t, fsDir, f) })
	}
	if t.Failed() {
		return
	}

	if os.Geteuid() != 0 {
		t.Skip("not root: the archive's files are checked; running kpr probe and iptables inside it needs chroot, as root")
	}
	if got := chroot(t, fsDir, "kpr", "--version"); !strings.HasPrefix(got, "kpr "+testVersion+" ") {
		t.Errorf("kpr --version in the image = %q, want kpr %s (the label's)", got, testVersion)
	}
	for cmd, want := range map[string]string{
		"iptables-legacy --version": "(legacy)",
		"iptables-nft --version":    "(nf_tables)",
		"iptables --version":        "(nf_tables)",
		"ipset --version":           "ipset v",
		"conntrack --version":       "conntrack v",
		// Loading the extensions kpr's rules use proves the xtables
		// plugins are there; --help exits before touching the kernel.
		"iptables-legacy -m comment -m conntrack -m statistic -m mark -m addrtype -m recent -j MASQUERADE --help": "MASQUERADE target options",
		"iptables-nft -m comment -m conntrack -m statistic -m mark -m addrtype -m recent -j DNAT --help":          "DNAT target options",
		"sh -c 'mountpoint /proc'": "is a mountpoint",
	} {
		if got := chroot(t, fsDir, "sh", "-c", cmd); !strings.Contains(got, want) {
			t.Errorf("%s in the image printed %q, want %q in it", cmd, got, want)
		}
	}
	// kpr probe inside the image sees what the same binary sees on the
	// host: the image lacks nothing the probes need.
	inImage := probe(t, chroot(t, fsDir, "kpr", "probe", "-o", "json"))
	host := exec.Command(filepath.Join(fsDir, BinaryPath), "probe", "-o", "json")
	out, err := host.Output()
	if err != nil {
		t.Fatalf("kpr probe on the host: %v", err)
	}
	if onHost := probe(t, string(out)); !reflect.DeepEqual(inImage, onHost) {
		t.Errorf("kpr probe in the image:\n%v\non the host:\n%v", inImage, onHost)
	}
}

// openArchive unpacks the OCI layout archive into dir and returns its one
// image, after checking the names the index gives it.
func openArchive(t *testing.T, archive, dir string) v1.Image {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := untar(tar.NewReader(f), dir); err != nil {
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
	if len(m.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != testVersion {
		t.Errorf("ref.name annotation %q, want the tag %q", got, testVersion)
	}
	if got, want := d.Annotations["io.containerd.image.name"], "ghcr.io/kpr-io/kpr:"+testVersion; got != want {
		t.Errorf("io.containerd.image.name annotation %q, want %q", got, want)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// extract writes the image's flattened file tree into dir.
func extract(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := untar(tar.NewReader(rc), dir); err != nil {
		t.Fatalf("extract the image: %v", err)
	}
}

func untar(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Name)))
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

// inside resolves p, an absolute path in the image, to the host path of
// the file it names, following symlinks as they resolve in the image.
func inside(t *testing.T, root, p string) string {
	t.Helper()
	for hops := 0; hops < 40; hops++ {
		// Resolve the directories first, then the last element.
		dir, base := path.Split(path.Clean(p))
		if dir != "/" {
			dir = strings.TrimPrefix(inside(t, root, dir), root)
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

// checkELF checks that the program at p exists in the image, and that its
// interpreter and every library it needs, and theirs, are in the image's
// library directories.
func checkELF(t *testing.T, root, p string) {
	f, err := elf.Open(inside(t, root, p))
	if err != nil {
		t.Fatalf("%s in the image: %v", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, _ := io.ReadAll(prog.Open())
		interp := strings.TrimRight(string(b), "\x00")
		if _, err := os.Stat(inside(t, root, interp)); err != nil {
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

// chroot runs argv in the image's file tree, in a mount namespace of its own
// with /proc, /sys and /dev, and returns its output.
func chroot(t *testing.T, root string, argv ...string) string {
	t.Helper()
	script := `set -e; r=$1; shift
mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"; mount --rbind /dev "$r/dev"
exec chroot "$r" "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", root}, argv...)...)
	cmd.Env = []string{"PATH=" + Path}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%q in the image: %v\n%s", argv, err, out)
	}
	return string(out)
}

type probeResult struct {
	Kernel   string `json:"kernel"`
	Features []struct {
		Name      string `json:"name"`
		Supported bool   `json:"supported"`
	} `json:"features"`
	ModeAuto struct {
		Backend string `json:"backend"`
	} `json:"modeAuto"`
}

func probe(t *testing.T, out string) probeResult {
	t.Helper()
	var r probeResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Kernel == "" || len(r.Features) == 0 {
		t.Fatalf("kpr probe -o json printed no report (%v):\n%s", err, out)
	}
	return r
}
