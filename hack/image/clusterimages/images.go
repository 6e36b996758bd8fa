package main

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// KubeVersion is the Kubernetes release the images are for: the tags below
// are the ones its sources name (docs/cluster-images.md says where;
// TestUpstreamTags checks them against the sources in the module cache).
const KubeVersion = "v1.37.2"

// The tags.
const (
	// PauseTag: cmd/kubeadm/app/constants PauseVersion and
	// test/utils/image/manifest.go's Pause; containerd v2.4.2's
	// DefaultSandboxImage (internal/cri/config) is the same image.
	PauseTag = "3.10.2"
	// CoreDNSTag: cmd/kubeadm/app/constants CoreDNSVersion.
	CoreDNSTag = "v1.14.6"
	// KubeProxyTag: the release itself, as kubeadm's GetKubernetesImage
	// tags kube-proxy (KubernetesVersionToImageTag of the cluster
	// configuration's kubernetesVersion, which tests/realcluster sets to
	// this release).
	KubeProxyTag = KubeVersion
	// The rest are test/utils/image/manifest.go's: Agnhost, BusyBox,
	// Nginx and NginxNew, GlibcDnsTesting, DistrolessIptables,
	// RegressionIssue74839.
	AgnhostTag              = "2.66.1"
	BusyBoxTag              = "1.37.0-2"
	NginxTag                = "1.27.0-2"
	NginxNewTag             = "1.28.0-2"
	GlibcDNSTestingTag      = "2.1.1"
	DistrolessIptablesTag   = "v0.9.9"
	RegressionIssue74839Tag = "1.5"
)

const (
	e2eRegistry = "registry.k8s.io/e2e-test-images/"
	// Path is every image's PATH (docker build gives an image without one
	// this one).
	Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Binary is a file of the cluster tools directory in an image.
type Binary struct {
	Tool string // its name in the tools directory
	Dst  string // its path in the image
}

// Spec is an image: its archive is Name.tar, its layers Base's (if any),
// then the file tree hack/cluster-images.sh leaves in rootfs/Name (unless
// empty), then Binaries.
type Spec struct {
	Name string
	// Base is the Name of an earlier image of Images this one is built
	// FROM: its layers come first, byte for byte, so that a node stores
	// them once. Its run configuration is not inherited.
	Base     string
	Refs     []string
	Binaries []Binary
	Config   v1.Config
}

// Images are the images hack/cluster-images.sh builds; the run
// configurations are upstream's images' (their Dockerfiles and base images),
// which the e2e tests and kubeadm's manifests rely on: most pods give args
// only, some a command.
var Images = []Spec{
	{
		// build/pause/Dockerfile: FROM scratch, /pause, USER 65535:65535.
		Name:     "pause",
		Refs:     []string{"registry.k8s.io/pause:" + PauseTag},
		Binaries: []Binary{{"pause", "/pause"}},
		Config: v1.Config{
			Entrypoint: []string{"/pause"},
			User:       "65535:65535",
			Env:        []string{"PATH=" + Path},
		},
	},
	{
		// coredns/coredns Dockerfile: ENTRYPOINT ["/coredns"]; kubeadm's
		// Deployment passes args -conf /etc/coredns/Corefile. Upstream
		// runs as nonroot with a file capability to bind :53; here root,
		// which the Deployment's capabilities (drop ALL, add
		// NET_BIND_SERVICE) let bind :53 without one.
		Name:     "coredns",
		Refs:     []string{"registry.k8s.io/coredns/coredns:" + CoreDNSTag},
		Binaries: []Binary{{"coredns", "/coredns"}},
		Config: v1.Config{
			Entrypoint:   []string{"/coredns"},
			Env:          []string{"PATH=" + Path},
			ExposedPorts: map[string]struct{}{"53/tcp": {}, "53/udp": {}},
		},
	},
	{
		// test/images/agnhost/Dockerfile: ENTRYPOINT ["/agnhost"],
		// CMD ["pause"]; CoreDNS at /coredns for the DNS tests.
		Name:     "agnhost",
		Refs:     []string{e2eRegistry + "agnhost:" + AgnhostTag},
		Binaries: []Binary{{"agnhost", "/agnhost"}, {"coredns", "/coredns"}},
		Config: v1.Config{
			Entrypoint: []string{"/agnhost"},
			Cmd:        []string{"pause"},
			Env:        []string{"PATH=" + Path},
			ExposedPorts: map[string]struct{}{
				"80/tcp": {}, "8080/tcp": {}, "8081/tcp": {}, "9376/tcp": {}, "5000/tcp": {},
			},
		},
	},
	{
		// busybox:1.37.0: CMD ["sh"].
		Name:   "busybox",
		Refs:   []string{e2eRegistry + "busybox:" + BusyBoxTag},
		Config: v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=" + Path}},
	},
	{
		// nginx:1.27-alpine: its entrypoint script, then nginx in the
		// foreground; SIGQUIT stops it gracefully. NginxNew (1.28) is
		// the same image here.
		Name: "nginx",
		Refs: []string{e2eRegistry + "nginx:" + NginxTag, e2eRegistry + "nginx:" + NginxNewTag},
		Config: v1.Config{
			Entrypoint:   []string{"/docker-entrypoint.sh"},
			Cmd:          []string{"nginx", "-g", "daemon off;"},
			Env:          []string{"PATH=" + Path},
			ExposedPorts: map[string]struct{}{"80/tcp": {}},
			StopSignal:   "SIGQUIT",
		},
	},
	{
		// test/images/glibc-dns-testing: debian:bookworm-slim (CMD
		// ["bash"]) with dnsutils and CoreDNS at /coredns.
		Name:     "glibc-dns-testing",
		Refs:     []string{e2eRegistry + "glibc-dns-testing:" + GlibcDNSTestingTag},
		Binaries: []Binary{{"coredns", "/coredns"}},
		Config:   v1.Config{Cmd: []string{"bash"}, Env: []string{"PATH=" + Path}},
	},
	{
		// kubernetes/release distroless-iptables: no entrypoint or
		// command (the KubeProxy test gives `sleep 600`); /go-runner
		// from the go-runner image, here kube-log-runner, which
		// upstream's server images put over it.
		Name:     "distroless-iptables",
		Refs:     []string{"registry.k8s.io/build-image/distroless-iptables:" + DistrolessIptablesTag},
		Binaries: []Binary{{"kube-log-runner", "/go-runner"}},
		Config:   v1.Config{Env: []string{"PATH=" + Path}},
	},
	{
		// test/images/regression-issue-74839/Dockerfile: debian-base
		// with the binary as ENTRYPOINT; the conntrack test's
		// boom-server (invalid conntrack state, kubernetes#74839).
		Name:     "regression-issue-74839",
		Refs:     []string{e2eRegistry + "regression-issue-74839:" + RegressionIssue74839Tag},
		Binaries: []Binary{{"regression-issue-74839", "/regression-issue-74839"}},
		Config: v1.Config{
			Entrypoint: []string{"/regression-issue-74839"},
			Env:        []string{"PATH=" + Path},
		},
	},
	{
		// k8s.io/kubernetes build/server-image/Dockerfile, BINARY
		// kube-proxy: FROM distroless-iptables (build/common.sh's
		// KUBE_PROXY_BASE_IMAGE), the binary at /usr/local/bin,
		// ENTRYPOINT ["/go-runner"]. kubeadm's DaemonSet gives the
		// command: /usr/local/bin/kube-proxy --config=...
		// --hostname-override=$(NODE_NAME).
		Name:     "kube-proxy",
		Base:     "distroless-iptables",
		Refs:     []string{"registry.k8s.io/kube-proxy:" + KubeProxyTag},
		Binaries: []Binary{{"kube-proxy", "/usr/local/bin/kube-proxy"}},
		Config: v1.Config{
			Entrypoint: []string{"/go-runner"},
			Env:        []string{"PATH=" + Path},
		},
	},
}
