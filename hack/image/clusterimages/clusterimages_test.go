package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kpr-io/kpr/hack/image/imagetest"
)

// TestClusterImages runs `make cluster-images` as a user would, with
// stand-ins for the pause, coredns and agnhost binaries and the real
// kube-proxy (hack/tools.sh's, built if it is not), then checks every
// archive: the references it carries, its run configuration, its base
// image's layers first, that the tools the e2e tests and kube-proxy run in
// it are there and find their libraries and, as root, that they run in a
// chroot of its file tree (nginx serves its page, kube-proxy cleans up its
// nftables and iptables rules); then, where the cluster tools build has made
// containerd, imports them into one and runs some (checkInContainerd). A
// second run with the same inputs must leave the archives alone.
func TestClusterImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images (downloads Debian packages on first use)")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	tools, out := filepath.Join(tmp, "tools"), filepath.Join(tmp, "images")
	standIns(t, tools)
	mk := func() string {
		t.Helper()
		// -o cluster-tools: the stand-ins are the cluster tools; make
		// would otherwise build every cluster tool into their
		// directory. The tools prerequisite builds kube-proxy into
		// KPR_TOOLS_DIR if it is not there (make test builds it anyway).
		cmd := exec.Command("make", "-C", root, "--no-print-directory", "-o", "cluster-tools", "cluster-images",
			"KPR_CLUSTER_TOOLS_DIR="+tools, "KPR_CLUSTER_IMAGES_DIR="+out)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make cluster-images: %v\n%s", err, b)
		}
		return string(b)
	}
	mk()

	// IMAGES names every archive and its references, in images.go's order.
	var listed []string
	for _, s := range Images {
		listed = append(listed, s.Name+".tar "+strings.Join(s.Refs, " "))
	}
	if b, err := os.ReadFile(filepath.Join(out, "IMAGES")); err != nil {
		t.Fatal(err)
	} else if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, listed) {
		t.Errorf("IMAGES lists\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(listed, "\n"))
	}

	layers := map[string][]v1.Hash{}
	for _, s := range Images {
		t.Run(s.Name, func(t *testing.T) {
			fsDir, l := checkArchive(t, s, filepath.Join(out, s.Name+".tar"), filepath.Join(tmp, s.Name))
			layers[s.Name] = l
			// An image built FROM another starts with its layers, which
			// a node then stores once.
			if base, ok := layers[s.Base]; s.Base != "" && (!ok || len(l) <= len(base) || !slices.Equal(l[:len(base)], base)) {
				t.Errorf("layers %v do not start with those of its base %s, %v", l, s.Base, base)
			}
			if t.Failed() {
				return
			}
			c := checks[s.Name]
			for _, f := range c.files {
				if _, err := os.Lstat(imagetest.Inside(t, fsDir, f)); err != nil {
					t.Errorf("%s is not in the image: %v", f, err)
				}
			}
			for _, f := range c.programs {
				imagetest.CheckELF(t, fsDir, f)
			}
			for f, want := range c.contents {
				b, err := os.ReadFile(imagetest.Inside(t, fsDir, f))
				if err != nil || !strings.Contains(string(b), want) {
					t.Errorf("%s in the image lacks %q (%v):\n%s", f, want, err, b)
				}
			}
			if t.Failed() {
				return
			}
			if os.Geteuid() != 0 {
				t.Skip("not root: the archive's files are checked; running its tools needs chroot, as root")
			}
			for _, r := range c.run {
				got, err := imagetest.Run(fsDir, r.net, r.argv...)
				if (err != nil) != r.fails || !strings.Contains(got, r.want) {
					t.Errorf("%q in the image: %v (want failure: %v), printed %q, want %q in it", r.argv, err, r.fails, got, r.want)
				}
			}
		})
	}

	// What a node does with them, where the cluster tools build has
	// made containerd.
	t.Run("containerd", func(t *testing.T) { checkInContainerd(t, out) })

	info, err := os.Stat(filepath.Join(out, "agnhost.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if got := mk(); !strings.Contains(got, "is up to date") {
		t.Errorf("a second make cluster-images with the same inputs built again:\n%s", got)
	}
	if again, err := os.Stat(filepath.Join(out, "agnhost.tar")); err != nil || !again.ModTime().Equal(info.ModTime()) {
		t.Errorf("a second make cluster-images with the same inputs rewrote agnhost.tar (%v)", err)
	}
}

// standIns builds a static program that prints its name and arguments, as
// pause, coredns and agnhost in dir: what the images need of them is that
// they are there and run.
func standIns(t *testing.T, dir string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "main.go")
	prog := `package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() { fmt.Printf("stand-in %s %q\n", filepath.Base(os.Args[0]), os.Args[1:]) }
`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, src)
	cmd.Dir = filepath.Dir(src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in binary: %v\n%s", err, b)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"coredns", "agnhost"} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// checkArchive checks the archive's references and run configuration
// against s and returns the directory of its file tree and its layers'
// digests.
func checkArchive(t *testing.T, s Spec, archive, dir string) (string, []v1.Hash) {
	t.Helper()
	a := imagetest.Open(t, archive, filepath.Join(dir, "layout"))
	var tags []string
	for _, r := range s.Refs {
		ref, err := name.ParseReference(r)
		if err != nil {
			t.Fatal(err)
		}
		tags = append(tags, ref.Identifier())
	}
	if !slices.Equal(a.Names, s.Refs) {
		t.Errorf("io.containerd.image.name annotations %q, want %q", a.Names, s.Refs)
	}
	if !slices.Equal(a.Tags, tags) {
		t.Errorf("org.opencontainers.image.ref.name annotations %q, want %q", a.Tags, tags)
	}
	cf, err := a.Image.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !reflect.DeepEqual(cf.Config, s.Config) {
		t.Errorf("run configuration %+v, want %+v", cf.Config, s.Config)
	}
	want := checks[s.Name]
	if !slices.Equal(cf.Config.Entrypoint, want.entrypoint) || !slices.Equal(cf.Config.Cmd, want.cmd) || cf.Config.User != want.user {
		t.Errorf("entrypoint %q cmd %q user %q, want %q %q %q (upstream's)",
			cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User, want.entrypoint, want.cmd, want.user)
	}
	if !slices.Contains(cf.Config.Env, "PATH="+Path) {
		t.Errorf("env %q lacks PATH", cf.Config.Env)
	}
	m, err := a.Image.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var layers []v1.Hash
	for _, l := range m.Layers {
		layers = append(layers, l.Digest)
	}
	fsDir := filepath.Join(dir, "fs")
	imagetest.Extract(t, a.Image, fsDir)
	return fsDir, layers
}

type run struct {
	argv  []string
	want  string // in the output
	net   bool   // in a network namespace of its own
	fails bool   // ends with a status other than 0
}

func sh(script, want string) run { return run{argv: []string{"sh", "-c", script}, want: want} }

// checks are what each image must carry and run: upstream's run
// configuration (written out again here, so that a change to images.go has
// to be a deliberate one) and the tools the e2e tests run in it.
var checks = map[string]struct {
	entrypoint, cmd []string
	user            string
	files           []string          // must exist
	programs        []string          // must find their libraries
	contents        map[string]string // file: a line it must have
	run             []run             // as root, in a chroot
}{
	"pause": {
		entrypoint: []string{"/pause"}, user: "65535:65535",
		files: []string{"/pause"},
		run:   []run{{argv: []string{"/pause"}, want: "stand-in pause []"}},
	},
	"coredns": {
		entrypoint: []string{"/coredns"},
		files:      []string{"/coredns", "/tmp"},
		// What kubeadm's Deployment runs.
		run: []run{{argv: []string{"/coredns", "-conf", "/etc/coredns/Corefile"}, want: `stand-in coredns ["-conf" "/etc/coredns/Corefile"]`}},
	},
	"agnhost": {
		entrypoint: []string{"/agnhost"}, cmd: []string{"pause"},
		files: []string{"/agnhost", "/agnhost-2", "/coredns", "/uploads", "/localhost.crt", "/localhost.key",
			"/bin/sh", "/usr/local/bin/iperf", "/etc/nsswitch.conf", "/etc/services", "/etc/protocols"},
		programs: []string{"/usr/bin/curl", "/usr/bin/dig", "/usr/bin/nslookup", "/usr/bin/host", "/usr/bin/nc",
			"/usr/bin/ip", "/usr/bin/ss", "/usr/bin/iperf", "/usr/bin/socat", "/bin/bash", "/usr/bin/ipcs",
			"/usr/bin/getent"},
		contents: map[string]string{
			"/etc/passwd": "user-defined-in-image:x:1000:1000:",
			"/etc/group":  "group-defined-in-image:x:50000:user-defined-in-image",
		},
		run: []run{
			{argv: []string{"/agnhost-2", "netexec"}, want: `stand-in agnhost-2 ["netexec"]`},
			sh("true && echo ok", "ok"),
			sh("curl --version", "curl 8."),
			// The conntrack tests' flags are netcat-openbsd's.
			sh("readlink -f $(command -v nc); nc -h 2>&1", "/usr/bin/nc.openbsd"),
			sh("nc -h 2>&1", "-W recvlimit"),
			sh("dig -v 2>&1", "DiG 9."),
			sh("nslookup -version 2>&1", "nslookup 9."),
			sh("ip -V", "ip utility"),
			sh("ss -V", "ss utility"),
			sh("iperf -v 2>&1 || true; command -v iperf", "/usr/local/bin/iperf"),
			sh("iperf -v 2>&1 || true", "iperf version 2"),
			sh("socat -V", "socat version"),
			sh("bash -c 'echo $BASH_VERSION'", "5."),
			sh("ipcs -V", "util-linux"),
			sh("getent passwd user-defined-in-image", "user-defined-in-image:x:1000:1000"),
			sh("echo '10.1.2.3 a-pod' >/etc/hosts; getent hosts a-pod", "10.1.2.3"),
			sh("id user-defined-in-image", "50000(group-defined-in-image)"),
			sh("for i in `seq 1 3`; do echo -n $i; done; timeout 5 sleep 0 && echo", "123"),
			sh("wget --help 2>&1; ping --help 2>&1; hostname", "Usage: wget"),
			// The DNS tests' probe, as far as it runs without a server.
			sh(`check="$(dig -v 2>&1)" && test -n "$check" && mkdir -p /results && echo OK >/results/probe && cat /results/probe`, "OK"),
			// curl and nc against servers in the image.
			{argv: []string{"sh", "-c", `echo hello >/uploads/index.html; httpd -p 127.0.0.1:8080 -h /uploads
				(echo hi-nc | nc -l 127.0.0.1 9000 >/tmp/got) & sleep 0.5
				curl -sS http://127.0.0.1:8080/index.html; nc -N 127.0.0.1 9000 </dev/null; wait; echo`}, want: "hello\nhi-nc", net: true},
		},
	},
	"busybox": {
		cmd:      []string{"sh"},
		files:    []string{"/bin/sh", "/bin/busybox", "/etc/passwd", "/etc/nsswitch.conf"},
		programs: []string{"/bin/busybox"},
		run: []run{
			// busybox-static's glibc finds a name in /etc/hosts
			// (kubelet's, in a pod) before it asks DNS.
			{argv: []string{"sh", "-c", "echo 127.0.0.1 boom-server >/etc/hosts; wget -T 2 http://boom-server:1/ 2>&1"},
				want: "(127.0.0.1:1)", net: true, fails: true},
			{argv: []string{"/bin/sh", "-c", "echo Pausing start. && sleep 0"}, want: "Pausing start."},
			sh("nc --help 2>&1; wget --help 2>&1", "Usage: wget"),
			sh("id", "uid=0(root)"),
		},
	},
	"nginx": {
		entrypoint: []string{"/docker-entrypoint.sh"}, cmd: []string{"nginx", "-g", "daemon off;"},
		files:    []string{"/docker-entrypoint.sh", "/bin/sh", "/usr/share/nginx/html/index.html", "/etc/nginx/mime.types", "/etc/nsswitch.conf"},
		programs: []string{"/usr/sbin/nginx"},
		contents: map[string]string{"/etc/passwd": "nginx:x:101:101:"},
		run: []run{
			sh("nginx -t 2>&1", "test is successful"),
			// The image's command, daemonized so that the test can
			// ask for the page; over IPv6 too where the host has it
			// (the entrypoint adds the listener).
			{argv: []string{"sh", "-c", "/docker-entrypoint.sh nginx && sleep 0.5 && wget -qO- http://127.0.0.1/"},
				want: "Welcome to nginx!</h1>", net: true},
			{argv: []string{"sh", "-c", `if [ -e /proc/net/if_inet6 ]; then
				/docker-entrypoint.sh nginx && sleep 0.5 && wget -qO- 'http://[::1]/'
				else echo 'no IPv6 here: Welcome to nginx!</h1>'; fi`},
				want: "Welcome to nginx!</h1>", net: true},
		},
	},
	"glibc-dns-testing": {
		cmd:      []string{"bash"},
		files:    []string{"/coredns", "/bin/sh", "/etc/nsswitch.conf", "/etc/passwd"},
		programs: []string{"/usr/bin/dig", "/usr/bin/getent", "/bin/dash", "/bin/bash", "/usr/bin/seq"},
		run: []run{
			sh(`for i in $(seq 1 2); do check="$(dig -v 2>&1)" && test -n "$check" && echo OK$i; done`, "OK1\nOK2"),
			sh("getent passwd nobody", "nobody:*:65534"),
			sh("awk 'BEGIN { print 6*7 }'; command -v which", "42"),
			{argv: []string{"/coredns", "-conf", "/etc/coredns/Corefile"}, want: "stand-in coredns"},
		},
	},
	"distroless-iptables": {
		files: []string{"/bin/sh", "/usr/sbin/iptables", "/usr/sbin/iptables-wrapper", "/go-runner", "/etc/passwd", "/etc/nsswitch.conf"},
		programs: []string{"/bin/dash", "/usr/bin/sleep", "/usr/bin/cat", "/usr/bin/grep", "/usr/sbin/conntrack",
			"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/usr/sbin/ipset", "/usr/sbin/nft", "/usr/bin/kmod",
			"/go-runner"},
		run: []run{
			// What the KubeProxy CLOSE_WAIT test runs in it.
			{argv: []string{"sleep", "0"}},
			sh("test -f /proc/net/nf_conntrack || which conntrack", ""),
			sh("cat /etc/passwd | grep -m 1 root", "root:x:0:0"),
			// The iptables-wrapper: until an iptables command runs,
			// the six are the wrapper; the first picks legacy where
			// kubelet's hint chain is in legacy's tables (the links
			// are put back for the next check) ...
			sh("readlink /usr/sbin/iptables /usr/sbin/ip6tables-restore", "iptables-wrapper\niptables-wrapper"),
			{argv: []string{"sh", "-c", `if iptables-legacy -t mangle -N KUBE-IPTABLES-HINT 2>/dev/null; then
				iptables --version; readlink /usr/sbin/ip6tables-save
				else echo 'no legacy iptables in this kernel: (legacy)'; echo xtables-legacy-multi; fi
				for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
				ln -sfn iptables-wrapper /usr/sbin/$c; done`}, want: "(legacy)\nxtables-legacy-multi", net: true},
			// ... and nft where neither has rules.
			{argv: []string{"sh", "-c", "iptables --version; readlink /usr/sbin/ip6tables-save"}, want: "(nf_tables)\nxtables-nft-multi", net: true},
			sh("iptables --version; iptables-legacy --version; ipset --version; nft --version; conntrack --version", "(nf_tables)"),
			{argv: []string{"/go-runner", "sh", "-c", "echo run by go-runner"}, want: "run by go-runner"},
		},
	},
	"kube-proxy": {
		entrypoint: []string{"/go-runner"},
		files:      []string{"/usr/local/bin/kube-proxy", "/go-runner", "/usr/sbin/iptables-wrapper", "/bin/sh"},
		programs: []string{"/usr/local/bin/kube-proxy", "/go-runner", "/usr/sbin/nft", "/usr/sbin/xtables-nft-multi",
			"/usr/sbin/xtables-legacy-multi", "/usr/sbin/ipset", "/usr/sbin/conntrack", "/usr/bin/kmod"},
		run: []run{
			{argv: []string{"kube-proxy", "--version"}, want: "Kubernetes v1.37.2"},
			// The image's entrypoint.
			{argv: []string{"/go-runner", "/usr/local/bin/kube-proxy", "--version"}, want: "Kubernetes v1.37.2"},
			sh("nft --version", "nftables v1."),
			sh("readlink /usr/sbin/iptables", "iptables-wrapper"),
			{argv: []string{"sh", "-c", "iptables --version; readlink /usr/sbin/iptables"}, want: "(nf_tables)\nxtables-nft-multi", net: true},
			sh("ipset --version; conntrack --version; modprobe --version", "kmod version"),
			// kubeadm's command, cleaning up: kube-proxy removes its
			// nftables tables (nft) and its iptables chains (iptables
			// through the wrapper, then put back) and ends.
			{argv: []string{"sh", "-c", `set -e
				for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
				ln -sfn iptables-wrapper /usr/sbin/$c; done
				printf '%s\n' 'apiVersion: kubeproxy.config.k8s.io/v1alpha1' 'kind: KubeProxyConfiguration' 'mode: nftables' >/tmp/config.conf
				nft add table ip kube-proxy; nft add table ip6 kube-proxy; iptables -t nat -N KUBE-SERVICES
				nft list tables | grep kube-proxy; iptables -t nat -S KUBE-SERVICES
				/usr/local/bin/kube-proxy --config=/tmp/config.conf --hostname-override=node-1 --cleanup
				if nft list tables | grep kube-proxy || iptables -t nat -S | grep KUBE-; then exit 1; fi
				echo cleaned up`}, want: "table ip6 kube-proxy\n-N KUBE-SERVICES\ncleaned up", net: true},
		},
	},
	"regression-issue-74839": {
		entrypoint: []string{"/regression-issue-74839"},
		files:      []string{"/tmp"},
		programs:   []string{"/regression-issue-74839"},
		// Without POD_IP, which the test sets, it says so and ends.
		run: []run{{argv: []string{"/regression-issue-74839"}, want: "No valid IP found", fails: true}},
	},
}

// TestChecksCoverImages keeps checks and Images in step.
func TestChecksCoverImages(t *testing.T) {
	for _, s := range Images {
		if _, ok := checks[s.Name]; !ok {
			t.Errorf("image %s has no checks", s.Name)
		}
	}
	if len(checks) != len(Images) {
		t.Errorf("%d checks for %d images", len(checks), len(Images))
	}
}
