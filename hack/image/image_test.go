package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/hack/image/imagetest"
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

	a := imagetest.Open(t, archive, filepath.Join(tmp, "layout"))
	if want := []string{testVersion}; !slices.Equal(a.Tags, want) {
		t.Errorf("ref.name annotations %q, want the tag %q", a.Tags, want)
	}
	if want := []string{"ghcr.io/kpr-io/kpr:" + testVersion}; !slices.Equal(a.Names, want) {
		t.Errorf("io.containerd.image.name annotations %q, want %q", a.Names, want)
	}
	img := a.Image
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
	imagetest.Extract(t, img, fsDir)
	// What the modes run (iptables-compat runs the variant's -save and
	// -restore, and `iptables --version`, and nft), what the init container
	// runs, what the cleanup DaemonSet runs (its wait and idle sleep), and
	// bpftool, which the README has operators run in kpr's pod.
	tools := []string{
		BinaryPath,
		"/usr/sbin/iptables", "/usr/sbin/iptables-nft", "/usr/sbin/iptables-legacy",
		"/usr/sbin/iptables-nft-save", "/usr/sbin/iptables-nft-restore",
		"/usr/sbin/iptables-legacy-save", "/usr/sbin/iptables-legacy-restore",
		"/usr/sbin/ip6tables-nft-restore", "/usr/sbin/ip6tables-legacy-restore",
		"/usr/sbin/ipset", "/usr/sbin/conntrack", "/usr/sbin/nft",
		"/bin/sh", "/bin/mount", "/bin/mountpoint", "/bin/sleep",
		"/usr/sbin/bpftool",
	}
	for _, f := range tools {
		t.Run(strings.TrimPrefix(f, "/"), func(t *testing.T) { imagetest.CheckELF(t, fsDir, f) })
	}
	if t.Failed() {
		return
	}

	if os.Geteuid() != 0 {
		t.Skip("not root: the archive's files are checked; running kpr probe and iptables inside it needs chroot, as root")
	}
	if got := imagetest.Chroot(t, fsDir, "kpr", "--version"); !strings.HasPrefix(got, "kpr "+testVersion+" ") {
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
		if got := imagetest.Chroot(t, fsDir, "sh", "-c", cmd); !strings.Contains(got, want) {
			t.Errorf("%s in the image printed %q, want %q in it", cmd, got, want)
		}
	}
	// kpr probe inside the image sees what the same binary sees on the
	// host: the image lacks nothing the probes need.
	inImage := probe(t, imagetest.Chroot(t, fsDir, "kpr", "probe", "-o", "json"))
	host := exec.Command(filepath.Join(fsDir, BinaryPath), "probe", "-o", "json")
	out, err := host.Output()
	if err != nil {
		t.Fatalf("kpr probe on the host: %v", err)
	}
	if onHost := probe(t, string(out)); !reflect.DeepEqual(inImage, onHost) {
		t.Errorf("kpr probe in the image:\n%v\non the host:\n%v", inImage, onHost)
	}
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
