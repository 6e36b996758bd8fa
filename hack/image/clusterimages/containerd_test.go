package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// containerdBinaries are what checkInContainerd runs: the cluster tools
// build's containerd, its ctr, shim and runc.
var containerdBinaries = []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"}

// clusterToolsDir is where the cluster tools build puts containerd (the
// default of hack/cluster-images.sh's KPR_CLUSTER_TOOLS_DIR).
func clusterToolsDir() string {
	if d := os.Getenv("KPR_CLUSTER_TOOLS_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache/kpr/cluster-tools", KubeVersion)
}

// checkInContainerd does on a containerd of its own what a node does with
// the archives in dir: `ctr -n k8s.io images import` each (by the Transfer
// API, unpacking into overlayfs), then checks the names containerd gave
// them, and runs containers of a few with runc: agnhost's tools, busybox
// as the Conntrack test runs it, nginx serving its page, the pause
// stand-in as user 65535, kube-proxy and its iptables and nft.
func checkInContainerd(t *testing.T, dir string) {
	if os.Geteuid() != 0 {
		t.Skip("not root: containerd needs root")
	}
	tools := clusterToolsDir()
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range containerdBinaries {
		if _, err := os.Stat(filepath.Join(tools, b)); err != nil {
			t.Skipf("no %s in %s (the cluster tools build puts it there): %v", b, tools, err)
		}
		if err := os.Symlink(filepath.Join(tools, b), filepath.Join(bin, b)); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	sock := filepath.Join(root, "sock")
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = %q
`, filepath.Join(root, "root"), filepath.Join(root, "state"), sock)
	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	path := bin + ":" + os.Getenv("PATH")
	logf, err := os.Create(filepath.Join(root, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	daemon := exec.Command(filepath.Join(bin, "containerd"), "--config", filepath.Join(root, "config.toml"))
	daemon.Env = append(os.Environ(), "PATH="+path)
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		daemon.Process.Kill()
		daemon.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("containerd's log:\n%s", b)
		}
	}()
	ctr := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "ctr"), append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		// ctr's own warnings (cgroup v1 is deprecated) are no output.
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(l, "time=") {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n"), err
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := ctr("version"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd did not come up: %v", err)
		}
	}

	var want []string
	for _, s := range Images {
		if out, err := ctr("images", "import", filepath.Join(dir, s.Name+".tar")); err != nil {
			t.Fatalf("ctr images import %s.tar: %v\n%s", s.Name, err, out)
		}
		want = append(want, s.Refs...)
	}
	out, err := ctr("images", "ls", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(out)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("containerd's images after the imports:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	id := fmt.Sprintf("kpr-imagetest-%d", os.Getpid())
	n := 0
	run := func(ref string, argv ...string) string {
		t.Helper()
		n++
		out, err := ctr(append([]string{"run", "--rm", ref, fmt.Sprintf("%s-%d", id, n)}, argv...)...)
		if err != nil {
			t.Errorf("ctr run %s %q: %v\n%s", ref, argv, err, out)
		}
		return out
	}
	for _, c := range []struct {
		ref  string
		argv []string
		want string
	}{
		{"registry.k8s.io/pause:" + PauseTag, nil, "stand-in pause []"},
		{"registry.k8s.io/pause:" + PauseTag, []string{"/pause", "-v"}, `stand-in pause ["-v"]`},
		{e2eRegistry + "agnhost:" + AgnhostTag, nil, `stand-in agnhost ["pause"]`},
		{e2eRegistry + "agnhost:" + AgnhostTag, []string{"sh", "-c", "id; nc -h 2>&1; curl --version; ip -V"}, "uid=0(root)"},
		{e2eRegistry + "busybox:" + BusyBoxTag, []string{"/bin/sh", "-c", "echo Pausing start. && sleep 0"}, "Pausing start."},
		{e2eRegistry + "nginx:" + NginxTag, []string{"sh", "-c", "ip link set lo up; /docker-entrypoint.sh nginx && sleep 0.5 && wget -qO- http://127.0.0.1/"}, "Welcome to nginx!"},
		// kube-proxy as kubeadm's DaemonSet runs it (its command, by
		// path), on its base's layers as unpacked by containerd, and
		// its entrypoint.
		{"registry.k8s.io/kube-proxy:" + KubeProxyTag, []string{"/usr/local/bin/kube-proxy", "--version"}, "Kubernetes " + KubeVersion},
		{"registry.k8s.io/kube-proxy:" + KubeProxyTag, []string{"/go-runner", "sh", "-c", "iptables --version; nft --version"}, "(nf_tables)\nnftables v1."},
	} {
		if got := run(c.ref, c.argv...); !strings.Contains(got, c.want) {
			t.Errorf("ctr run %s %q printed %q, want %q in it", c.ref, c.argv, got, c.want)
		}
	}
}
