package cluster

import (
	"context"
	"os"
	"testing"

	"go.uber.org/zap/zaptest"
)

// StartForTest starts a cluster for t and stops it in t.Cleanup. It fails
// the test (rather than skipping) when the cluster cannot start: missing
// tools are built by hack/tools.sh, and any other failure is a real one.
// Progress is logged through t unless opts.Logger is set.
// Under -short (`make unit`) it skips the test: a cluster is no unit.
func StartForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping under -short: needs a real kube-apiserver and etcd")
	}
	// The kernel-matrix VMs (tests/kernels) run the kernel-facing tests
	// only: the API-server suites run on the host, which has the tools.
	if release := os.Getenv("KPR_KERNEL_MATRIX"); release != "" {
		t.Skipf("skipping in the kernel-matrix VM (%s): needs a real kube-apiserver and etcd, which run on the host (make test)", release)
	}
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("starting the test cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the test cluster: %v", err)
		}
	})
	return c
}
