package realcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/harness"
)

// The images of kpr the smoke test installs and then rolls the DaemonSet
// to, built by make test-cluster-smoke (make image with these references).
const (
	kprImageEnv     = "KPR_CLUSTER_KPR_IMAGE"
	kprNextImageEnv = "KPR_CLUSTER_KPR_NEXT_IMAGE"
	// kprNextTag is the tag of the second image.
	kprNextTag = "v0.1.0-next"
)

// TestSmoke installs kpr on a real two-node cluster with the chart, by the
// README's quick start, and checks what a platform team checks first: the
// DaemonSet rolls out, kpr reports its eBPF mode and is healthy through the
// API server's proxy, CoreDNS (kubeadm's) becomes ready through kpr and
// answers a pod, a NodePort answers from outside the nodes, and a rolling
// update of kpr loses none of the requests sent to it every 10 ms. Then
// every command of the README's CLI tour runs on a node, and kpr is
// installed again from the kustomize base.
func TestSmoke(t *testing.T) {
	harness.RequireRoot(t)
	image, next := os.Getenv(kprImageEnv), os.Getenv(kprNextImageEnv)
	if image == "" || next == "" {
		t.Skipf("skipping: %s and %s name kpr's image archives; make test-cluster-smoke builds them and runs this test", kprImageEnv, kprNextImageEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c := upForTest(ctx, t, Options{
		Images:      []string{"pause.tar", "coredns.tar", "agnhost.tar", "busybox.tar"},
		ExtraImages: []string{image, next},
	})
	run := func(tool string, args ...string) string {
		t.Helper()
		out, err := c.Run(ctx, tool, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}

	// kubeadm's CoreDNS first, as on a new cluster: it waits for a Service
	// proxy to reach the API server through the kubernetes Service.
	if err := c.InstallCoreDNS(ctx); err != nil {
		t.Fatal(err)
	}

	// A NodePort Service for the README's curl: its pods start without a
	// Service proxy.
	run("kubectl", "create", "deployment", "web", "--replicas=2", "--image=registry.k8s.io/e2e-test-images/agnhost:2.66.1",
		"--", "/agnhost", "netexec", "--http-port=8080")
	run("kubectl", "expose", "deployment", "web", "--port=80", "--target-port=8080", "--type=NodePort")
	if err := c.WaitRollout(ctx, "default", "deployment/web", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	svc, err := c.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The README's quick start: helm install with the control plane's
	// address, the rollout, kpr status and a curl of the NodePort.
	runReadmeQuickStart(ctx, t, c, svc.Spec.Ports[0].NodePort)
	chart := filepath.Join(root, "deploy/helm/kpr")
	pods, err := c.Client.CoreV1().Pods("kpr-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kpr"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != len(c.Nodes) {
		t.Fatalf("%d kpr pods, want one on each of %d nodes", len(pods.Items), len(c.Nodes))
	}
	for _, p := range pods.Items {
		out := run("kubectl", "get", "--raw", fmt.Sprintf("/api/v1/namespaces/kpr-system/pods/%s:10256/proxy/healthz", p.Name))
		if !strings.Contains(out, "lastUpdated") && !strings.Contains(out, "ok") {
			t.Errorf("/healthz of %s through the API server's proxy: %q", p.Name, out)
		}
	}

	// CoreDNS reaches the API server through kpr, then answers a pod.
	if err := c.WaitRollout(ctx, "kube-system", "deployment/coredns", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	run("kubectl", "run", "dns-check", "--restart=Never", "--image=registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
		"--", "nslookup", "kubernetes.default.svc.cluster.local")
	run("kubectl", "wait", "pod/dns-check", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=5m")
	if out := run("kubectl", "logs", "dns-check"); !strings.Contains(out, "10.96.0.1") {
		t.Errorf("nslookup kubernetes.default from a pod:\n%s", out)
	}

	// The NodePort, from outside the nodes, on every node.
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, fmt.Sprintf("http://%s:%d/hostname", n.address, svc.Spec.Ports[0].NodePort))
	}
	// kpr programs the NodePort once it has seen the Service and its
	// endpoints; from the first answer on, every request must succeed.
	if err := c.WaitAnswer(ctx, urls, 2*time.Minute); err != nil {
		t.Fatalf("NodePort from outside: %v", err)
	}
	traffic, err := c.StartTraffic(urls, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if tally := traffic.Stop(); tally.Sent == 0 || len(tally.Failed) > 0 {
		t.Fatalf("NodePort from outside: %d requests, %d failed: %s", tally.Sent, len(tally.Failed), strings.Join(first(tally.Failed, 10), "; "))
	}

	// A rolling update of kpr under that traffic.
	traffic, err = c.StartTraffic(urls, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	run("helm", "upgrade", "kpr", chart, "--namespace", "kpr-system", "--reuse-values", "--set", "image.tag="+kprNextTag)
	rollErr := c.WaitRollout(ctx, "kpr-system", "daemonset/kpr", 10*time.Minute)
	time.Sleep(5 * time.Second)
	tally := traffic.Stop()
	if rollErr != nil {
		t.Fatal(rollErr)
	}
	t.Logf("rolling update of kpr: %d NodePort requests, %d failed, %d slower than %s", tally.Sent, len(tally.Failed), len(tally.Slow), slowRequest)
	if len(tally.Failed) > 0 {
		t.Errorf("%d of %d NodePort requests failed during kpr's rolling update: %s", len(tally.Failed), tally.Sent, strings.Join(first(tally.Failed, 10), "; "))
	}

	// The README's tour of the CLI on a node; it ends with kpr cleanup.
	runReadmeCLI(ctx, t, c)

	// Last, the same kpr from the kustomize base instead of the chart.
	run("helm", "uninstall", "kpr", "--namespace", "kpr-system", "--wait")
	reinstallWithKustomize(ctx, t, c, root)
	status := run("kubectl", "-n", "kpr-system", "exec", "ds/kpr", "--", "kpr", "status")
	if !regexp.MustCompile(`(?m)^mode:\s+ebpf\b`).MatchString(status) {
		t.Errorf("kpr from the kustomize base: kpr status does not report the eBPF mode:\n%s", status)
	}
	if err := c.WaitAnswer(ctx, urls, 2*time.Minute); err != nil {
		t.Errorf("kpr from the kustomize base: NodePort from outside: %v", err)
	}
}

// reinstallWithKustomize installs kpr from deploy/base as deploy/README.md
// says: an overlay that sets the API server's address in the kpr-apiserver
// ConfigMap, applied with kubectl apply -k; and waits for the rollout.
func reinstallWithKustomize(ctx context.Context, t *testing.T, c *Cluster, root string) {
	t.Helper()
	overlay := t.TempDir()
	if err := os.Symlink(filepath.Join(root, "deploy/base"), filepath.Join(overlay, "base")); err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(`resources: [base]
configMapGenerator:
  - name: kpr-apiserver
    namespace: kpr-system
    behavior: replace
    literals: [host=%s, port=%s]
`, controlPlane, c.APIServerPort())
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Run(ctx, "kubectl", "apply", "-k", overlay); err != nil {
		t.Fatalf("kubectl apply -k of an overlay of deploy/base: %v\n%s", err, out)
	}
	if err := c.WaitRollout(ctx, "kpr-system", "daemonset/kpr", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
