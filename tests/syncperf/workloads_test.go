package syncperf

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/tests/harness"
)

var flagStarts = flag.Int("syncperf.starts", 2, "kpr start-ups per binary and workload in BenchmarkStartupWorkloads")

// heapEnv names a directory: if set, BenchmarkStartupWorkloads runs kpr
// with --profiling and saves its heap profile once all is programmed, as
// heap-<workload>-<binary>-<n>.pb.gz, for `go tool pprof`, and as text
// with the runtime's MemStats (heap-….txt).
const heapEnv = "KPR_SYNCPERF_HEAP_DIR"

// BenchmarkStartupWorkloads measures kpr's start-up (time and peak RSS)
// against two populations of -syncperf.services Services in one run, one
// API server each: "bare" objects with only the fields kpr reads (this
// benchmark's objects before issue 7) and "dressed" ones as Helm, kubectl
// apply and the EndpointSlice controller write them (kubeobj.DressService,
// kubeobj.DressSlice). With -syncperf.baseline-kpr it starts that binary
// too, alternating with this tree's, so both builds meet the same API
// server and machine load:
//
//	go test ./tests/syncperf -run '^$' -bench StartupWorkloads -benchtime 1x -timeout 60m \
//	    -syncperf.baseline-kpr /tmp/kpr-main
func BenchmarkStartupWorkloads(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	for _, w := range []struct {
		name string
		bare bool
	}{{"bare", true}, {"dressed", false}} {
		b.Run(w.name, func(b *testing.B) {
			f := newFixture(b, ctx, Population{Namespace: "syncperf", Services: *flagServices,
				EndpointsPerService: *flagEndpoints, Bare: w.bare})
			binaries := []struct{ name, path string }{{"this-tree", ""}}
			if *flagBaseline != "" {
				binaries = append([]struct{ name, path string }{{"baseline", *flagBaseline}}, binaries...)
			}
			// The floor under any cold start on this machine: the API
			// server listing every object, received but not decoded.
			for range 2 {
				took, size, err := rawListAll(ctx, f.cluster.KubeconfigPath)
				if err != nil {
					b.Fatal(err)
				}
				b.Logf("%s: the API server lists every Service and EndpointSlice (%d MB of protobuf) in %v, received, not decoded",
					w.name, size>>20, took.Round(time.Millisecond))
			}
			results := make(map[string][]Startup)
			cg, err := harness.NewCgroup(b)
			if err != nil {
				b.Fatal(err)
			}
			for n := range *flagStarts {
				for _, bin := range binaries {
					st := startOnce(b, ctx, f, cg, bin.path, fmt.Sprintf("%s-%s-%d", w.name, bin.name, n))
					b.Logf("%s %s start %d: %v", w.name, bin.name, n, st)
					results[bin.name] = append(results[bin.name], st)
				}
			}
			for _, bin := range binaries {
				b.Run(bin.name, func(b *testing.B) { reportStartups(b, results[bin.name]) })
			}
		})
	}
}

// startOnce starts kpr (binary, or this tree's if empty) on a fresh BPF
// root, waits until all is programmed, saves a heap profile if heapEnv is
// set, and stops it.
func startOnce(b *testing.B, ctx context.Context, f *fixture, cg *harness.Cgroup, binary, label string) Startup {
	b.Helper()
	dir := os.Getenv(heapEnv)
	var args []string
	if dir != "" {
		args = append(args, "--profiling")
	}
	run := f.startKprBinary(b, cg, binary, args...)
	st, reader := f.measureStartup(b, ctx, run)
	if dir != "" {
		if err := saveHeapProfile(run.proc.MetricsAddr, "", filepath.Join(dir, "heap-"+label+".pb.gz")); err != nil {
			b.Errorf("%s is set but the heap profile was not saved: %v", heapEnv, err)
		}
		// The text form ends with the runtime's MemStats: how much the
		// heap mapped at most (HeapSys) against what it holds, and the
		// runtime's own memory beside it.
		if err := saveHeapProfile(run.proc.MetricsAddr, "?debug=1", filepath.Join(dir, "heap-"+label+".txt")); err != nil {
			b.Errorf("%s is set but the heap profile was not saved: %v", heapEnv, err)
		}
	}
	reader.Close()
	run.stop()
	return st
}

func saveHeapProfile(addr, query, path string) error {
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap" + query)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/heap: %s", resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// reportStartups reports the mean of the start-ups' phases and the highest
// peak RSS among them.
func reportStartups(b *testing.B, sts []Startup) {
	var total Startup
	var maxStart time.Duration
	for _, st := range sts {
		total.CachesSynced += st.CachesSynced
		total.Programmed += st.Programmed
		total.Proc.CPU += st.Proc.CPU
		total.Proc.PeakRSS = max(total.Proc.PeakRSS, st.Proc.PeakRSS)
		total.Proc.RSSFile = max(total.Proc.RSSFile, st.Proc.RSSFile)
		maxStart = max(maxStart, st.Programmed)
	}
	n := float64(len(sts))
	b.ReportMetric(float64(total.Programmed.Nanoseconds())/n, "ns/op")
	b.ReportMetric(total.CachesSynced.Seconds()/n, "start->synced-s")
	b.ReportMetric(total.SyncedToProgrammed().Seconds()/n, "synced->programmed-s")
	b.ReportMetric(maxStart.Seconds(), "max-start->programmed-s")
	b.ReportMetric(total.Proc.CPU.Seconds()/n, "cpu-s")
	b.ReportMetric(float64(total.Proc.PeakRSS)/(1<<20), "peak-rss-MiB")
	b.ReportMetric(float64(total.Proc.RSSFile)/(1<<20), "rss-file-MiB")
}

// rawListAll lists every Service and EndpointSlice as kpr asks for them
// (protobuf, compressed if the API server compresses) and returns how long
// that took and the bytes received, without decoding them.
func rawListAll(ctx context.Context, kubeconfig string) (time.Duration, int, error) {
	client, err := apiclient.New(apiclient.Connection{Kubeconfig: kubeconfig})
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	size := 0
	for _, c := range []struct {
		client   rest.Interface
		resource string
	}{{client.Core, "services"}, {client.Discovery, "endpointslices"}} {
		body, err := c.client.Get().Resource(c.resource).DoRaw(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("list %s: %w", c.resource, err)
		}
		size += len(body)
	}
	return time.Since(start), size, nil
}
