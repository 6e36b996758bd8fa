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
	if release := os.Getenv("KPR_KERNEL_MATRIX"); release != "" {
		// The kernel-matrix VMs (tests/kernels) carry the tools only for
		// the suites that need a kernel the host lacks (tests/e2e's IPVS
		// mode); the other API-server suites run on the host, which has
		// them.
		if dir := os.Getenv(ToolsDirEnv); dir == "" || checkTools(dir) != nil {
			t.Skipf("skipping in the kernel-matrix VM (%s): needs a real kube-apiserver and etcd, which run on the host (make test)", release)
		}
		// The VM has no network device and so no default route, whose
		// interface's address the API server would advertise (as the
		// "kubernetes" Service's endpoint); a documentation address
		// stands in, which no test connects to.
		if opts.AdvertiseAddress == "" {
			opts.AdvertiseAddress = "192.0.2.1"
		}
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
