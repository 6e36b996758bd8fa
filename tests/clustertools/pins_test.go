// Package clustertools checks the pins of the cluster tools that
// hack/cluster-tools.sh builds (docs/cluster-tools.md): that the script's
// Kubernetes version is the one tests/tools requires, that every binary it
// lists comes from a tool of a pinned Go module at a released version, and
// that the pins follow what Kubernetes itself asks for where it says
// (CoreDNS, e2e.test's imports). It reads files only: nothing is built.
// The Go modules pinning the tools are the folders below this one.
package clustertools

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository's root, two folders up from this package's.
var root = filepath.Join("..", "..")

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shellVar is the value of a NAME=value line of a shell script or a
// NAME ?= value line of a Makefile.
func shellVar(t *testing.T, rel, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `\s*\??=\s*(\S+)\s*$`).FindStringSubmatch(read(t, rel))
	if m == nil {
		t.Fatalf("%s sets no %s", rel, name)
	}
	return m[1]
}

type binary struct{ name, dir, pkg string }

// scriptBinaries is hack/cluster-tools.sh's BINARIES list.
func scriptBinaries(t *testing.T) []binary {
	t.Helper()
	m := regexp.MustCompile(`(?s)\nBINARIES=\((.*?)\n\)`).FindStringSubmatch(read(t, "hack/cluster-tools.sh"))
	if m == nil {
		t.Fatal("hack/cluster-tools.sh has no BINARIES=( ... ) list")
	}
	var bins []binary
	for _, line := range strings.Split(strings.TrimSpace(m[1]), "\n") {
		f := strings.Fields(strings.Trim(strings.TrimSpace(line), `"`))
		if len(f) != 3 {
			t.Fatalf("hack/cluster-tools.sh: BINARIES line %q is not: binary folder package", line)
		}
		bins = append(bins, binary{f[0], f[1], f[2]})
	}
	if len(bins) == 0 {
		t.Fatal("hack/cluster-tools.sh: BINARIES is empty")
	}
	return bins
}

// goMod is the part of a go.mod this test reads.
type goMod struct {
	require map[string]string // module path: version
	replace map[string]string // module path: replacement (path and version)
	tools   []string
}

// parseGoMod reads the require, replace and tool directives of a go.mod,
// single-line or in blocks.
func parseGoMod(t *testing.T, rel string) goMod {
	t.Helper()
	mod := goMod{require: map[string]string{}, replace: map[string]string{}}
	block := ""
	sc := bufio.NewScanner(strings.NewReader(read(t, rel)))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case block != "" && f[0] == ")":
			block = ""
			continue
		case block == "" && len(f) == 2 && f[1] == "(":
			block = f[0]
			continue
		case block == "":
			mod.add(f[0], f[1:]) // a single-line directive
		default:
			mod.add(block, f)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return mod
}

func (mod *goMod) add(directive string, f []string) {
	switch directive {
	case "require":
		if len(f) >= 2 {
			mod.require[f[0]] = f[1]
		}
	case "tool":
		if len(f) >= 1 {
			mod.tools = append(mod.tools, f[0])
		}
	case "replace":
		if i := slices.Index(f, "=>"); i > 0 {
			mod.replace[f[0]] = strings.Join(f[i+1:], " ")
		}
	}
}

// provider is the required module that holds package pkg: the longest
// module path that is pkg or a folder above it.
func (mod goMod) provider(pkg string) (string, bool) {
	best := ""
	for m := range mod.require {
		if (pkg == m || strings.HasPrefix(pkg, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	return best, best != ""
}

// release matches a released version: no pseudo-version, no pre-release.
var release = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)

// TestKubernetesVersion: the Kubernetes release of the cluster tools is
// the one tests/tools requires (so kubelet and kube-apiserver are one
// release), and the scripts and Makefile fragments agree on it.
func TestKubernetesVersion(t *testing.T) {
	want := parseGoMod(t, "tests/tools/go.mod").require["k8s.io/kubernetes"]
	if !release.MatchString(want) {
		t.Fatalf("tests/tools/go.mod requires k8s.io/kubernetes %q, want a release", want)
	}
	for _, c := range []struct{ file, name string }{
		{"hack/cluster-tools.sh", "KUBE_VERSION"},
		{"hack/tools.sh", "KUBE_VERSION"},
		{"tests/clustertools/clustertools.mk", "KPR_CLUSTER_TOOLS_VERSION"},
		{"tests/tools/tools.mk", "KPR_TOOLS_VERSION"},
	} {
		if got := shellVar(t, c.file, c.name); got != want {
			t.Errorf("%s: %s=%s, want %s (tests/tools/go.mod's k8s.io/kubernetes)", c.file, c.name, got, want)
		}
	}
}

// TestBinariesArePinned: every binary hack/cluster-tools.sh builds is a
// tool of the module in the folder it names (e2e.test, a test binary,
// is imported by that module instead), the module holding its package is
// required at a released version, not replaced, and the binary's name is
// the one go build gives it, which the script relies on. Each module
// under tests/clustertools has no tool that the script does not build.
func TestBinariesArePinned(t *testing.T) {
	bins := scriptBinaries(t)
	pkgsOf := map[string][]string{}
	for _, b := range bins {
		pkgsOf[b.dir] = append(pkgsOf[b.dir], b.pkg)
		if filepath.Ext(b.pkg) == ".c" {
			if _, err := os.Stat(filepath.Join(root, b.dir, b.pkg)); err != nil {
				t.Errorf("%s: %v", b.name, err)
			}
			continue
		}
		modFile := filepath.Join(b.dir, "go.mod")
		mod := parseGoMod(t, modFile)
		if strings.HasSuffix(b.name, ".test") {
			if want := path.Base(b.pkg) + ".test"; b.name != want {
				t.Errorf("%s is built from %s, whose go test -c binary is %s", b.name, b.pkg, want)
			}
			if !importedBy(t, b.dir, b.pkg) {
				t.Errorf("%s: no file of %s imports %s, so go.mod does not keep its test dependencies", b.name, b.dir, b.pkg)
			}
		} else {
			if want := path.Base(b.pkg); path.Base(b.name) != want {
				t.Errorf("%s is built from %s, which go build names %s", b.name, b.pkg, want)
			}
			if !slices.Contains(mod.tools, b.pkg) {
				t.Errorf("%s: %s is not a tool of %s", b.name, b.pkg, modFile)
			}
		}
		m, ok := mod.provider(b.pkg)
		if !ok {
			t.Errorf("%s: %s requires no module holding %s", b.name, modFile, b.pkg)
			continue
		}
		if v := mod.require[m]; !release.MatchString(v) {
			t.Errorf("%s: %s requires %s %s, want a released version", b.name, modFile, m, v)
		}
		if r, ok := mod.replace[m]; ok {
			t.Errorf("%s: %s replaces %s with %s", b.name, modFile, m, r)
		}
	}
	for dir, pkgs := range pkgsOf {
		if !strings.HasPrefix(dir, "tests/clustertools/") || filepath.Ext(pkgs[0]) == ".c" {
			continue // tests/tools also holds hack/tools.sh's tools
		}
		for _, tool := range parseGoMod(t, filepath.Join(dir, "go.mod")).tools {
			if !slices.Contains(pkgs, tool) {
				t.Errorf("%s/go.mod has tool %s, which hack/cluster-tools.sh does not build", dir, tool)
			}
		}
	}
}

// importedBy: some .go file of the module in folder dir imports pkg.
func importedBy(t *testing.T, dir, pkg string) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".go" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		found = found || strings.Contains(string(b), `"`+pkg+`"`)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// kubernetesSource is the folder of k8s.io/kubernetes at tests/tools'
// version in the module cache, or "" if it is not there (make tools puts
// it there).
func kubernetesSource(t *testing.T) string {
	t.Helper()
	v := parseGoMod(t, "tests/tools/go.mod").require["k8s.io/kubernetes"]
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Logf("go env GOMODCACHE: %v", err)
		return ""
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "k8s.io", "kubernetes@"+v)
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	return dir
}

// TestCoreDNSVersion: CoreDNS is pinned at the version kubeadm of the
// same Kubernetes release deploys. Needs k8s.io/kubernetes in the module
// cache; skipped without it.
func TestCoreDNSVersion(t *testing.T) {
	src := kubernetesSource(t)
	if src == "" {
		t.Skip("k8s.io/kubernetes is not in the module cache (make tools downloads it)")
	}
	b, err := os.ReadFile(filepath.Join(src, "cmd", "kubeadm", "app", "constants", "constants.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`CoreDNSVersion\s*=\s*"(v[^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatal("kubeadm's constants.go sets no CoreDNSVersion")
	}
	want := string(m[1])
	if got := parseGoMod(t, "tests/clustertools/coredns/go.mod").require["github.com/coredns/coredns"]; got != want {
		t.Errorf("tests/clustertools/coredns requires github.com/coredns/coredns %s; kubeadm deploys %s", got, want)
	}
}

// TestE2EImports: tests/tools/e2eimports imports everything e2e_test.go
// of k8s.io/kubernetes/test/e2e imports outside the standard library, so
// go mod tidy keeps what go test -c needs. Needs k8s.io/kubernetes in
// the module cache; skipped without it.
func TestE2EImports(t *testing.T) {
	src := kubernetesSource(t)
	if src == "" {
		t.Skip("k8s.io/kubernetes is not in the module cache (make tools downloads it)")
	}
	b, err := os.ReadFile(filepath.Join(src, "test", "e2e", "e2e_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	have := read(t, "tests/tools/e2eimports/imports.go")
	imports := regexp.MustCompile(`(?s)\nimport \((.*?)\n\)`).FindSubmatch(b)
	if imports == nil {
		t.Fatal("e2e_test.go has no import block")
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:[\w.]+\s+)?"([^"]+)"`).FindAllStringSubmatch(string(imports[1]), -1) {
		pkg := m[1]
		if !strings.Contains(strings.SplitN(pkg, "/", 2)[0], ".") {
			continue // standard library
		}
		if !strings.Contains(have, `_ "`+pkg+`"`) {
			t.Errorf("tests/tools/e2eimports/imports.go does not import %s, which e2e_test.go imports", pkg)
		}
	}
}

// TestDocsNameVersions: docs/cluster-tools.md names the version of every
// pinned module the binaries come from, so a bump that forgets the docs
// fails here.
func TestDocsNameVersions(t *testing.T) {
	doc := read(t, "docs/cluster-tools.md")
	seen := map[string]bool{}
	for _, b := range scriptBinaries(t) {
		if filepath.Ext(b.pkg) == ".c" {
			continue
		}
		mod := parseGoMod(t, filepath.Join(b.dir, "go.mod"))
		m, ok := mod.provider(b.pkg)
		if !ok || seen[m] {
			continue
		}
		seen[m] = true
		if want := m + " " + mod.require[m]; !strings.Contains(doc, want) {
			t.Errorf("docs/cluster-tools.md does not name %q", want)
		}
	}
}

// TestHelmVersion: the Helm CLI that installs kpr on the real cluster is
// the Helm whose library renders and packages the chart in
// tests/deploy/helm, so what the chart tests accept is what installs.
func TestHelmVersion(t *testing.T) {
	const helm = "helm.sh/helm/v3"
	cli := parseGoMod(t, "tests/clustertools/helm/go.mod").require[helm]
	lib := parseGoMod(t, "tests/deploy/helm/go.mod").require[helm]
	if cli == "" || cli != lib {
		t.Errorf("tests/clustertools/helm pins %s %q, tests/deploy/helm %q: pin both to one release", helm, cli, lib)
	}
}
