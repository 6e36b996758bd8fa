// Package release tests what `make release` stamps and refuses
// (docs/releasing.md): the version check, the version in the binary, and
// that go.mod's toolchain is the Go the Dockerfile, the README and CI
// build with. The chart's stamping is tested with the chart, in
// tests/deploy/helm. None of these needs root.
package release

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// root is the repository's root, two folders up from this package's.
var root = filepath.Join("..", "..")

// TestReleaseCheck: hack/release-check.sh takes a tag and refuses what
// `git describe --tags --always --dirty` prints off a tagged, clean
// commit; RELEASE_ALLOW_DIRTY=1 lets anything through.
func TestReleaseCheck(t *testing.T) {
	for _, tc := range []struct {
		version string
		ok      bool
	}{
		{"v0.1.0", true},
		{"v0.9.1", true},
		{"v1.2.3-rc.1", true},
		{"v0.1.0-3-gabc123-dirty", false}, // commits since the tag, and uncommitted changes
		{"v0.1.0-3-gabc123", false},       // commits since the tag
		{"v0.1.0-dirty", false},           // the tag, with uncommitted changes
		{"3bc07f7", false},                // no tag at all (--always)
		{"3bc07f7-dirty", false},
		{"0.1.0", false}, // kpr's tags start with v
		{"v0.1", false},
		{"dev", false}, // no git at all
	} {
		out, err := releaseCheck(tc.version, false)
		if ok := err == nil; ok != tc.ok {
			t.Errorf("hack/release-check.sh %s: accepted %v, want %v\n%s", tc.version, ok, tc.ok, out)
		}
		if !tc.ok && !strings.Contains(out, "refusing VERSION="+tc.version) {
			t.Errorf("hack/release-check.sh %s said %q, want it to name the version it refuses", tc.version, out)
		}
		if !tc.ok {
			if out, err := releaseCheck(tc.version, true); err != nil {
				t.Errorf("RELEASE_ALLOW_DIRTY=1 hack/release-check.sh %s: %v\n%s", tc.version, err, out)
			}
		}
	}
}

func releaseCheck(version string, allowDirty bool) (string, error) {
	cmd := exec.Command(filepath.Join(root, "hack", "release-check.sh"), version)
	cmd.Env = append(os.Environ(), "RELEASE_ALLOW_DIRTY=")
	if allowDirty {
		cmd.Env = append(cmd.Env, "RELEASE_ALLOW_DIRTY=1")
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestMakeReleaseRefusesADirtyVersion: `make release` stops at the check,
// before it builds anything, with the check's message.
func TestMakeReleaseRefusesADirtyVersion(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dist")
	const version = "v0.1.0-3-gabc123-dirty"
	cmd := exec.Command("make", "-C", root, "--no-print-directory", "release", "VERSION="+version, "RELEASE_DIR="+dir)
	cmd.Env = append(os.Environ(), "RELEASE_ALLOW_DIRTY=")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make release VERSION=%s succeeded:\n%s", version, out)
	}
	if !strings.Contains(string(out), "refusing VERSION="+version) {
		t.Errorf("make release VERSION=%s failed without the check's message:\n%s", version, out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("make release made %s before refusing", dir)
	}
}

// TestBuildStampsTheVersion builds kpr as `make release` does (make build:
// static, with the Makefile's ldflags) and checks that `kpr --version`
// prints the version it was given, and that the binary is static, so the
// release's kpr-linux-<arch> runs on any distribution.
func TestBuildStampsTheVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kpr with -trimpath, which shares no build cache with go test")
	}
	bin := filepath.Join(t.TempDir(), "kpr")
	const version = "v0.9.1"
	mk := exec.Command("make", "-C", root, "--no-print-directory", "build", "VERSION="+version, "KPR_BIN="+bin)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("kpr --version: %v\n%s", err, out)
	}
	if want := "kpr " + version + " ("; !strings.HasPrefix(string(out), want) {
		t.Errorf("kpr --version printed %q, want it to start with %q", out, want)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a dynamic loader (PT_INTERP); make build must build it static", bin)
		}
	}
}

// TestToolchainAgrees: go.mod's toolchain line is the Go that the
// Dockerfile's build stage and the README name, and, in CI, the Go that
// built this test.
func TestToolchainAgrees(t *testing.T) {
	toolchain := find(t, "go.mod", `(?m)^toolchain go(\S+)$`)
	if got := find(t, "Dockerfile", `(?m)^FROM golang:([0-9.]+)-`); got != toolchain {
		t.Errorf("the Dockerfile builds with golang:%s, go.mod's toolchain is go%s", got, toolchain)
	}
	if got := find(t, "README.md", `builds with Go ([0-9]+\.[0-9]+\.[0-9]+)`); got != toolchain {
		t.Errorf("README.md names Go %s, go.mod's toolchain is go%s", got, toolchain)
	}
	goLine := find(t, "go.mod", `(?m)^go (\S+)$`)
	if goLine == toolchain {
		// The go command drops a toolchain line equal to the go line (go
		// mod tidy), which would leave the toolchain unstated.
		t.Errorf("go.mod's go line equals its toolchain %s; go mod tidy would drop the toolchain line", toolchain)
	}
	// CI builds with the machine's Go; a developer's newer Go may run
	// the tests too, so only CI is held to the toolchain.
	if os.Getenv("CI") == "true" && runtime.Version() != "go"+toolchain {
		t.Errorf("CI built this test with %s, go.mod's toolchain is go%s", runtime.Version(), toolchain)
	}
}

// find returns the first submatch of pattern in the file at path under
// the repository's root.
func find(t *testing.T, path, pattern string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(pattern).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s has no match for %s", path, pattern)
	}
	return string(m[1])
}
