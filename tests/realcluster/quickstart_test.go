package realcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/namedns"
	"github.com/kpr-io/kpr/tests/realcluster/docblocks"
)

// TestQuickstart runs every sh block of docs/quickstart.md, in order, on a
// real cluster that starts as a kubeadm cluster does: kube-proxy (kubeadm's
// DaemonSet) and CoreDNS. The page's placeholders (the API server's
// address 10.0.0.10:6443, NODE_IP) become the cluster's; every other word
// is the page's. The blocks run from the cluster network, where a reader's
// workstation would be, with kubectl and helm on the PATH.
func TestQuickstart(t *testing.T) {
	harness.RequireRoot(t)
	image := os.Getenv(kprImageEnv)
	if image == "" || os.Getenv("KPR_CLUSTER_DOCS") == "" {
		t.Skipf("skipping: make test-cluster-docs sets %s and KPR_CLUSTER_DOCS and runs this test", kprImageEnv)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docblocks.Read(filepath.Join(root, "docs/quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	c := upForTest(ctx, t, Options{
		Registry:     true,
		ImageAliases: []string{"docker.io/library/nginx:latest=registry.k8s.io/e2e-test-images/nginx:1.27.0-2"},
		ExtraImages:  []string{image},
	})
	if err := c.InstallKubeProxy(ctx, "iptables"); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCoreDNS(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct{ ns, name string }{{"kube-system", "daemonset/kube-proxy"}, {"kube-system", "deployment/coredns"}} {
		if err := c.WaitRollout(ctx, w.ns, w.name, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	// The reader's working directory: a checkout, for deploy/helm/kpr.
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(root, "deploy"), filepath.Join(work, "deploy")); err != nil {
		t.Fatal(err)
	}
	placeholders := strings.NewReplacer(
		"apiServer.host=10.0.0.10", "apiServer.host="+controlPlane.String(),
		"apiServer.port=6443", "apiServer.port="+c.APIServerPort(),
		"NODE_IP", c.nodes[0].address.String())
	for _, b := range blocks {
		script := placeholders.Replace(b.Script)
		if strings.Contains(script, "kubectl apply -f kube-proxy-daemonset.yaml") {
			// The edit the page asks for before this block.
			if err := stripServerFields(filepath.Join(work, "kube-proxy-daemonset.yaml")); err != nil {
				t.Fatal(err)
			}
		}
		// A block that hangs (a rollout that never ends) fails on its own
		// instead of using up the test's hour.
		blockCtx, cancelBlock := context.WithTimeout(ctx, 15*time.Minute)
		out, err := c.runShell(blockCtx, work, script)
		cancelBlock()
		t.Logf("docs/quickstart.md:%d:\n%s\n%s", b.Line, script, out)
		if err != nil {
			t.Fatalf("docs/quickstart.md:%d: %v", b.Line, err)
		}
		switch {
		case strings.Contains(script, "kpr status"):
			if !regexp.MustCompile(`(?m)^mode:\s+ebpf\b`).MatchString(out) {
				t.Errorf("docs/quickstart.md:%d: kpr status does not report the eBPF mode", b.Line)
			}
		case strings.Contains(script, "curl"):
			if !strings.Contains(out, "200") {
				t.Errorf("docs/quickstart.md:%d: the NodePort did not answer 200", b.Line)
			}
		}
	}
	// The way back ends with kube-proxy serving again.
	if err := c.WaitRollout(ctx, "kube-system", "daemonset/kube-proxy", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// runShell runs script with bash (-e, -u, pipefail) in dir, from the
// cluster network, with the cluster's tools on the PATH and the admin's
// kubeconfig, and returns its output.
func (c *Cluster) runShell(ctx context.Context, dir, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+namedns.Path(c.NetNS), "--", "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.KubeconfigPath, "PATH="+c.toolsDir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// stripServerFields deletes from a saved object what the API server set,
// as docs/quickstart.md tells the reader to before applying it again.
func stripServerFields(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	delete(obj, "status")
	if meta, ok := obj["metadata"].(map[string]any); ok {
		for _, f := range []string{"resourceVersion", "uid", "creationTimestamp"} {
			delete(meta, f)
		}
	}
	out, err := yaml.Marshal(obj)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
