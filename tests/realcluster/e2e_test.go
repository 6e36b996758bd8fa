package realcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/namedns"
)

// The e2e run's settings, from make test-cluster.
const (
	// e2eProxyEnv names the Service proxy to install: "kpr" (the chart's
	// defaults: eBPF where the kernel has it), "kpr-iptables", or
	// "kube-proxy" (kubeadm's DaemonSet in nftables mode, the reference).
	e2eProxyEnv = "KPR_CLUSTER_E2E_PROXY"
	// e2eReportEnv is where the JUnit report goes.
	e2eReportEnv = "KPR_CLUSTER_E2E_REPORT"
	// e2eFocusEnv, if set, replaces e2eFocus (to run one test by hand).
	e2eFocusEnv = "KPR_CLUSTER_E2E_FOCUS"
	// e2eTimeoutEnv, if set, is ginkgo's --timeout (default 10h): when it
	// passes, ginkgo stops and still writes the report of what ran.
	e2eTimeoutEnv = "KPR_CLUSTER_E2E_TIMEOUT"
)

// e2eProcs is how many specs ginkgo runs at once.
const e2eProcs = 4

// TestE2E installs a Service proxy on a real cluster and runs upstream's
// e2e.test (the cluster's release, from make cluster-tools) against it from
// the cluster network, writing the JUnit report make test-cluster turns
// into docs/cluster-e2e.md.
func TestE2E(t *testing.T) {
	harness.RequireRoot(t)
	proxy, report, image := os.Getenv(e2eProxyEnv), os.Getenv(e2eReportEnv), os.Getenv(kprImageEnv)
	if proxy == "" || report == "" || image == "" {
		t.Skipf("skipping: %s, %s and %s are set by make test-cluster, which runs this test", e2eProxyEnv, e2eReportEnv, kprImageEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Hour)
	defer cancel()
	// The nodes pull from the cluster's registry: they boot sooner than
	// with every image imported, and the e2e tests' pulls are real pulls.
	c := upForTest(ctx, t, Options{Registry: true, ExtraImages: []string{image}})
	if err := c.InstallCoreDNS(ctx); err != nil {
		t.Fatal(err)
	}
	if err := installProxy(ctx, c, proxy); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitRollout(ctx, "kube-system", "deployment/coredns", 10*time.Minute); err != nil {
		t.Fatal(err)
	}

	timeout := "10h"
	if v := os.Getenv(e2eTimeoutEnv); v != "" {
		timeout = v
	}
	focus := E2EFocus
	if f := os.Getenv(e2eFocusEnv); f != "" {
		focus = f
	}
	// e2e.test runs in the cluster network, as a node would: it reaches
	// NodePorts and pods directly. ginkgo runs its specs e2eProcs at a
	// time, as upstream's hack/ginkgo-e2e.sh does: most of a spec's time
	// is spent waiting for pods, which the emulated nodes make long.
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+namedns.Path(c.NetNS), "--",
		filepath.Join(c.toolsDir, "ginkgo"),
		fmt.Sprintf("--procs=%d", e2eProcs),
		"--focus="+focus,
		"--skip="+E2ESkip,
		"--junit-report="+filepath.Base(report),
		"--output-dir="+filepath.Dir(report),
		"--timeout="+timeout,
		"--no-color",
		"-v",
		filepath.Join(c.toolsDir, "e2e.test"), "--",
		"--kubeconfig="+c.KubeconfigPath,
		"--provider=skeleton",
		"--num-nodes=2",
		"--dump-logs-on-failure=false",
		"--report-dir="+filepath.Dir(report))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	began := time.Now()
	err := cmd.Run()
	t.Logf("e2e.test against %s: %s, %v", proxy, time.Since(began).Round(time.Second), err)
	logProxyPods(ctx, t, c)
	// Failed tests are the report's business; only a run that wrote no
	// report failed as a run.
	if _, statErr := os.Stat(report); statErr != nil {
		t.Fatalf("e2e.test wrote no report (%v): %v", statErr, err)
	}
	if err != nil && !strings.Contains(err.Error(), "exit status") {
		t.Fatal(err)
	}
}

// installProxy installs the Service proxy of an e2e run and waits until it
// runs on every node.
func installProxy(ctx context.Context, c *Cluster, proxy string) error {
	switch proxy {
	case "kube-proxy":
		if err := c.InstallKubeProxy(ctx, "nftables"); err != nil {
			return err
		}
		return c.WaitRollout(ctx, "kube-system", "daemonset/kube-proxy", 10*time.Minute)
	case "kpr":
		return installKpr(ctx, c)
	case "kpr-iptables":
		return installKpr(ctx, c, "mode=iptables")
	default:
		return fmt.Errorf("%s=%q: want kpr, kpr-iptables or kube-proxy", e2eProxyEnv, proxy)
	}
}

// logProxyPods logs the Service proxy's pods as the run leaves them, with
// their restarts: a proxy that crashed during the run explains the
// failures of the tests that ran meanwhile.
func logProxyPods(ctx context.Context, t *testing.T, c *Cluster) {
	for _, ns := range []string{"kpr-system", "kube-system"} {
		out, err := c.Run(ctx, "kubectl", "-n", ns, "get", "pods", "-o", "wide")
		t.Logf("the pods of %s after the run (%v):\n%s", ns, err, out)
	}
}
