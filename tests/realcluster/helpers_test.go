package realcluster

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/tests/cluster"
)

// upForTest starts a cluster for t, logging to t; when t ends, it puts the
// cluster's logs into t's if t failed, then takes the cluster down.
func upForTest(ctx context.Context, t *testing.T, opts Options) *Cluster {
	t.Helper()
	opts.Logger = zaptest.NewLogger(t)
	c, err := Up(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, c)
		}
		if err := c.Down(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// installKpr installs kpr with its chart as docs/quickstart.md does (step
// 3), with the control plane's address and the chart values in sets
// (name=value), and waits until the DaemonSet has rolled out.
func installKpr(ctx context.Context, c *Cluster, sets ...string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	args := []string{"install", "kpr", filepath.Join(root, "deploy/helm/kpr"), "--namespace", "kpr-system", "--create-namespace",
		"--set", "apiServer.host=" + controlPlane.String(), "--set", "apiServer.port=" + c.APIServerPort()}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	if _, err := c.Run(ctx, "helm", args...); err != nil {
		return err
	}
	return c.WaitRollout(ctx, "kpr-system", "daemonset/kpr", 10*time.Minute)
}

// keepLogs puts what a failure needs into the test's log, before Down
// removes the cluster: the pods, kpr's logs and the end of each node's
// console (containerd and the kubelet log there).
func keepLogs(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"-n", "kpr-system", "logs", "-l", "k8s-app=kpr", "-c", "kpr", "--tail=40", "--prefix"},
	} {
		out, err := c.Run(ctx, "kubectl", args...)
		t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	logs, _ := filepath.Glob(c.LogPath("vm-*"))
	for _, l := range logs {
		t.Logf("%s", cluster.LogTail(l, 60))
	}
}
