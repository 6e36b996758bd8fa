package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// containerdVersion is the containerd the test cluster runs, whose default
// sandbox image has to be among the images.
const containerdVersion = "v2.4.2"

// TestUpstreamTags checks the references of Images against the sources
// that name them, in the Go module cache (the test skips what is not
// there; it downloads nothing): kubeadm's pause, CoreDNS and kube-proxy
// images, containerd's sandbox image, and every image of test/utils/image's
// manifest that the sig-network e2e tests and the framework helpers they
// create pods with name; and kube-proxy's image against upstream's build
// of it and kubeadm's DaemonSet.
func TestUpstreamTags(t *testing.T) {
	// The release is the one the repository's tools and cluster are:
	// tests/tools' k8s.io/kubernetes (kube-proxy, kubeadm, the e2e
	// tests), the kubernetesVersion tests/realcluster gives kubeadm (which
	// tags kube-proxy's image), and hack/cluster-images.sh's.
	root := filepath.Join("..", "..", "..")
	for _, v := range []struct{ file, re string }{
		{"tests/tools/go.mod", `(?m)^\s*k8s\.io/kubernetes (v\S+)$`},
		{"tests/realcluster/addons.go", `const KubernetesVersion = "([^"]+)"`},
		{"hack/cluster-images.sh", `(?m)^KUBE_VERSION=(\S+)$`},
	} {
		if got := match(t, read(t, root, v.file), v.re); got != KubeVersion {
			t.Errorf("%s has Kubernetes %s; images.go's KubeVersion is %s", v.file, got, KubeVersion)
		}
	}

	var refs []string
	for _, s := range Images {
		refs = append(refs, s.Refs...)
	}
	have := func(what, ref string) {
		t.Helper()
		if !slices.Contains(refs, ref) {
			t.Errorf("%s is %s, which no image carries (images.go has %q)", what, ref, refs)
		}
	}

	kube := moduleDir(t, "k8s.io/kubernetes@"+KubeVersion)
	if kube != "" {
		constants := read(t, kube, "cmd/kubeadm/app/constants/constants.go")
		repo := match(t, read(t, kube, "cmd/kubeadm/app/apis/kubeadm/v1beta4/defaults.go"), `DefaultImageRepository\s*=\s*"([^"]+)"`)
		// kubeadm's images.GetPauseImage and GetDNSImage, with the
		// default repository.
		have("kubeadm's pause image", repo+"/pause:"+match(t, constants, `PauseVersion\s*=\s*"([^"]+)"`))
		have("kubeadm's CoreDNS image", repo+"/coredns/coredns:"+match(t, constants, `CoreDNSVersion\s*=\s*"([^"]+)"`))
		checkKubeProxy(t, kube, repo, constants, have)

		manifest := read(t, kube, "test/utils/image/manifest.go")
		registries := map[string]string{}
		for _, m := range regexp.MustCompile(`(\w+Registry):\s*"([^"]+)"`).FindAllStringSubmatch(manifest, -1) {
			registries[m[1]] = m[2]
		}
		images := map[string]string{}
		for _, m := range regexp.MustCompile(`configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*"([^"]+)",\s*"([^"]+)"\}`).FindAllStringSubmatch(manifest, -1) {
			images[m[1]] = registries[m[2]] + "/" + m[3] + ":" + m[4]
		}
		if len(images) < 10 {
			t.Fatalf("found %d images in manifest.go; has its form changed?", len(images))
		}
		used := map[string]bool{}
		ident := regexp.MustCompile(`imageutils\.(\w+)`)
		for _, dir := range []string{"test/e2e/network", "test/e2e/common/network", "test/e2e/framework/network", "test/e2e/framework/service", "test/e2e/framework/pod"} {
			err := filepath.WalkDir(filepath.Join(kube, dir), func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
					return err
				}
				b, err := os.ReadFile(p)
				for _, m := range ident.FindAllStringSubmatch(string(b), -1) {
					switch {
					case m[1] == "GetPauseImageName":
						used["Pause"] = true
					case images[m[1]] != "":
						used[m[1]] = true
					}
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		var ids []string
		for id := range used {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		t.Logf("images the sig-network tests name: %s", strings.Join(ids, ", "))
		for _, id := range ids {
			have("manifest.go's "+id, images[id])
		}
		// The nginx image's second name.
		have("manifest.go's NginxNew", images["NginxNew"])
	}

	if ctrd := moduleDir(t, "github.com/containerd/containerd/v2@"+containerdVersion); ctrd != "" {
		have("containerd "+containerdVersion+"'s sandbox image",
			match(t, read(t, ctrd, "internal/cri/config/config.go"), `DefaultSandboxImage\s*=\s*"([^"]+)"`))
	}
}

// checkKubeProxy checks the kube-proxy image against kubeadm's naming of
// it and its DaemonSet's command, and against upstream's server image
// (build/server-image/Dockerfile, build/common.sh): FROM distroless-iptables,
// the binary at /usr/local/bin, ENTRYPOINT /go-runner.
func checkKubeProxy(t *testing.T, kube, repo, constants string, have func(what, ref string)) {
	t.Helper()
	// proxy.go: images.GetKubernetesImage(constants.KubeProxy, cfg),
	// which is GetGenericImage(the control plane's repository, the
	// default one here, image, KubernetesVersionToImageTag(the
	// configuration's kubernetesVersion)).
	match(t, read(t, kube, "cmd/kubeadm/app/phases/addons/proxy/proxy.go"), `Image:\s*(images\.GetKubernetesImage\(constants\.KubeProxy, cfg\))`)
	images := read(t, kube, "cmd/kubeadm/app/images/images.go")
	match(t, images, `kubernetesImageTag := (kubeadmutil\.KubernetesVersionToImageTag\(cfg\.KubernetesVersion\))`)
	match(t, images, `(return GetGenericImage\(repoPrefix, image, kubernetesImageTag\))`)
	match(t, images, `(return fmt\.Sprintf\("%s/%s:%s", prefix, image, tag\))`)
	allowed := match(t, read(t, kube, "cmd/kubeadm/app/util/version.go"), "func KubernetesVersionToImageTag\\(version string\\) string \\{\\s*allowed := regexp\\.MustCompile\\(`([^`]+)`\\)")
	tag := regexp.MustCompile(allowed).ReplaceAllString(KubeVersion, "_")
	have("kubeadm's kube-proxy image", repo+"/"+match(t, constants, `\bKubeProxy\s*=\s*"([^"]+)"`)+":"+tag)

	i := slices.IndexFunc(Images, func(s Spec) bool { return s.Name == "kube-proxy" })
	if i < 0 {
		t.Fatal("no kube-proxy image")
	}
	s := Images[i]
	var dsts []string
	for _, b := range s.Binaries {
		dsts = append(dsts, b.Dst)
	}
	// The DaemonSet's command runs the binary by its path.
	cmd := match(t, read(t, kube, "cmd/kubeadm/app/phases/addons/proxy/manifests.go"), `command:\s*\n\s*- (\S+)\n`)
	if !slices.Contains(dsts, cmd) {
		t.Errorf("kubeadm's DaemonSet runs %s; the image has %q", cmd, dsts)
	}
	server := read(t, kube, "build/server-image/Dockerfile")
	if dir := match(t, server, `COPY [^\n]*\$\{BINARY\} (\S+)/\$\{BINARY\}\n`); !slices.Contains(dsts, dir+"/kube-proxy") {
		t.Errorf("upstream's server image has kube-proxy in %s; this one has %q", dir, dsts)
	}
	if e := match(t, server, `ENTRYPOINT \["([^"]+)"\]`); !slices.Equal(s.Config.Entrypoint, []string{e}) {
		t.Errorf("upstream's server image's entrypoint is %s; this one's %q", e, s.Config.Entrypoint)
	}
	// build/common.sh: KUBE_PROXY_BASE_IMAGE is distroless-iptables at
	// __default_distroless_iptables_version.
	common := read(t, kube, "build/common.sh")
	match(t, common, `KUBE_PROXY_BASE_IMAGE="\$\{KUBE_PROXY_BASE_IMAGE:-(\$__default_dynamic_base_image)\}"`)
	match(t, common, `__default_dynamic_base_image="(\$KUBE_BASE_IMAGE_REGISTRY/distroless-iptables:\$__default_distroless_iptables_version)"`)
	base := match(t, common, `KUBE_BASE_IMAGE_REGISTRY="\$\{KUBE_BASE_IMAGE_REGISTRY:-([^}]+)\}"`) +
		"/distroless-iptables:" + match(t, common, `__default_distroless_iptables_version=(\S+)`)
	j := slices.IndexFunc(Images, func(b Spec) bool { return b.Name == s.Base })
	if j < 0 || !slices.Contains(Images[j].Refs, base) {
		t.Errorf("upstream's kube-proxy image is FROM %s; this one's base is %q", base, s.Base)
	}
}

// moduleDir is the directory of module@version in the module cache, or ""
// (and the test says so) when it is not there.
func moduleDir(t *testing.T, modVersion string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Logf("%s is not in the module cache, not checked (%v %s)", modVersion, err, m.Error)
		return ""
	}
	return m.Dir
}

func read(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func match(t *testing.T, s, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %s in the source; has its form changed?", re)
	}
	return m[1]
}
