package syncperf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// nodeName is the Node kpr runs as; it has an address so that kpr's node
// tracking takes its normal path.
const nodeName = "syncperf-node"

// fixture is a test API server holding a population.
type fixture struct {
	cluster *cluster.Cluster
	client  kubernetes.Interface // unthrottled, for populating and updating
	svcs    []*Service
	// replacements counts the replacement addresses handed out, so every
	// update writes an address no endpoint had before.
	replacements int
}

func newFixture(tb testing.TB, ctx context.Context, pop Population) *fixture {
	tb.Helper()
	harness.RequireRoot(tb) // kpr loads BPF programs and the fixture makes a cgroup
	c := cluster.StartForTest(tb, cluster.Options{APIServerArgs: map[string]string{
		// 16 writers and a watching kpr stay far below these, but the
		// defaults (400/200) are what a loaded API server would hit first.
		"max-requests-inflight":          "1000",
		"max-mutating-requests-inflight": "500",
	}})
	client, err := FastClient(c.Config)
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.CreateNode(ctx, nodeName, []string{"192.0.2.10"}, nil); err != nil {
		tb.Fatal(err)
	}
	began := time.Now()
	pop.Progress = func(done int) {
		tb.Logf("%d of %d Services written after %v", done, pop.Services, time.Since(began).Round(time.Second))
	}
	svcs, err := Populate(ctx, client, pop)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("created %d Services with %d endpoints each (%d objects) in %v",
		pop.Services, pop.EndpointsPerService, 2*pop.Services, time.Since(began).Round(time.Millisecond))
	logObjectSizes(tb, ctx, client, pop.Namespace)
	// Build kpr now, so that no measurement includes the build.
	if _, err := kprproc.Binary(); err != nil {
		tb.Fatal(err)
	}
	return &fixture{cluster: c, client: client, svcs: svcs}
}

// nextReplacement returns an endpoint address never used before.
func (f *fixture) nextReplacement() int {
	f.replacements++
	return f.replacements
}

// perfEnv names a directory: if set, every kpr start-up is recorded with
// `perf record -g` into perf-<pid>.data there, for `perf report`.
const perfEnv = "KPR_SYNCPERF_PERF_DIR"

// kprRun is one `kpr run` under measurement.
type kprRun struct {
	proc    *kprproc.Process
	started time.Time
	stop    func()
	// stopProfile ends the perf recording, if one runs; safe to call twice.
	stopProfile func()
}

// startKpr starts `kpr run` against the fixture with a fresh BPF root, its
// programs attached to cgroup (which no process is in). stop kills it and
// removes its dataplane; it also runs at tb's cleanup if not called before.
// args are extra `kpr run` flags.
func (f *fixture) startKpr(tb testing.TB, cgroup *harness.Cgroup, args ...string) *kprRun {
	tb.Helper()
	return f.startKprBinary(tb, cgroup, "", args...)
}

// startKprBinary is startKpr with another kpr binary; empty means this
// tree's.
func (f *fixture) startKprBinary(tb testing.TB, cgroup *harness.Cgroup, binary string, args ...string) *kprRun {
	tb.Helper()
	opts := kprproc.Options{
		Binary:     binary,
		Kubeconfig: f.cluster.KubeconfigPath,
		NodeName:   nodeName,
		CgroupRoot: cgroup.Path,
		LogPath:    filepath.Join(tb.TempDir(), "kpr.log"),
		Args:       append(slices.Clone(LogArgs), args...),
	}
	started := time.Now()
	p, err := kprproc.Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	run := &kprRun{proc: p, started: started, stopProfile: func() {}}
	if dir := os.Getenv(perfEnv); dir != "" {
		run.stopProfile = startPerf(tb, dir, p.PID())
	}
	var once sync.Once
	run.stop = func() {
		once.Do(func() {
			run.stopProfile()
			if err := p.Cleanup(); err != nil {
				tb.Errorf("stopping kpr and removing its dataplane: %v", err)
			}
		})
	}
	tb.Cleanup(run.stop)
	return run
}

// startPerf records pid's stacks until the returned function is called.
func startPerf(tb testing.TB, dir string, pid int) func() {
	out := filepath.Join(dir, fmt.Sprintf("perf-%d.data", pid))
	cmd := exec.Command("perf", "record", "-F", "499", "-g", "-o", out, "-p", strconv.Itoa(pid))
	if err := cmd.Start(); err != nil {
		tb.Fatalf("%s is set but perf does not start: %v", perfEnv, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt) // perf writes its file on SIGINT
			// perf exits with the SIGINT status; only a failure to wait counts.
			var exit *exec.ExitError
			if err := cmd.Wait(); err != nil && !errors.As(err, &exit) {
				tb.Errorf("perf record: %v", err)
			}
			tb.Logf("kpr's start-up profile: perf report -i %s", out)
		})
	}
}

// measureStartup waits until every Service is programmed.
func (f *fixture) measureStartup(tb testing.TB, ctx context.Context, run *kprRun) (Startup, *MapReader) {
	tb.Helper()
	st, reader, err := MeasureStartup(ctx, run.proc, run.started, f.svcs)
	run.stopProfile()
	if err != nil {
		tb.Fatalf("kpr start-up: %v", err)
	}
	tb.Cleanup(func() { reader.Close() })
	return st, reader
}

// update replaces one endpoint of the k-th updated Service and times it.
func (f *fixture) update(tb testing.TB, ctx context.Context, run *kprRun, reader *MapReader, k int) Update {
	tb.Helper()
	s := f.svcs[k%len(f.svcs)]
	u, err := MeasureUpdate(ctx, f.client, reader, run.proc, s, k%len(s.Endpoints),
		ReplacementAddr(f.nextReplacement()), 10*time.Second)
	if err != nil {
		tb.Fatalf("update %d: %v", k, err)
	}
	return u
}

// logObjectSizes logs how large the first Service and its slice are as the
// API server sends them (protobuf, as kpr lists them), so that runs with
// different objects can be told apart.
func logObjectSizes(tb testing.TB, ctx context.Context, client kubernetes.Interface, namespace string) {
	tb.Helper()
	svc, err := client.CoreV1().Services(namespace).Get(ctx, "svc-0", metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	slice, err := client.DiscoveryV1().EndpointSlices(namespace).Get(ctx, "svc-0", metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("svc-0 is %d bytes in protobuf (%d managedFields entries, %d annotations), its slice %d bytes (%d managedFields entries)",
		svc.Size(), len(svc.ManagedFields), len(svc.Annotations), slice.Size(), len(slice.ManagedFields))
}
