package syncperf

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
)

// The scale of the benchmark; the defaults are issue 3's. Smaller runs:
//
//	go test ./tests/syncperf -run '^$' -bench . -benchtime 1x -syncperf.services=1000
var (
	flagServices  = flag.Int("syncperf.services", 10000, "Services in the API server")
	flagEndpoints = flag.Int("syncperf.endpoints", 10, "endpoints per Service (one EndpointSlice each)")
	flagUpdates   = flag.Int("syncperf.updates", 200, "EndpointSlice updates timed per benchmark iteration")
	flagChurn     = flag.Int("syncperf.churn-updates", 150, "updates of one EndpointSlice in update-churn-resync-5s")
	flagBaseline  = flag.String("syncperf.baseline-kpr", "",
		"a kpr binary (e.g. built from an older commit) to run update-churn-resync-5s with as well, against the same API server")
)

// BenchmarkControlPlane fills a real API server with -syncperf.services
// Services of -syncperf.endpoints endpoints (once, shared by both parts),
// then measures `kpr run` as a separate process:
//
// startup: from process start to every Service in the maps; one iteration
// is one fresh kpr on a fresh BPF root. Metrics: start->watching-s (BPF
// loaded, informers started), start->synced-s (informer caches synced),
// synced->programmed-s (the issue's < 2 s target) and the CPU time kpr
// used in it (synced->programmed-cpu-s), reconcile-s (the first full sync
// as kpr timed it), cpu-s and peak-rss-MiB of the kpr process when all was
// programmed; ns/op is start to all programmed.
//
// update: with kpr synced, -syncperf.updates sequential EndpointSlice
// updates, each replacing one endpoint of a different Service, timed until
// the maps hold the new backends. Metrics are percentiles from the moment
// the API server answered the UPDATE (p99-ms is the issue's < 50 ms
// target) and from just before it was sent (send-*); ns/op is the mean
// from the answer.
//
// Run it once per iteration (each iteration takes seconds):
//
//	go test ./tests/syncperf -run '^$' -bench ControlPlane -benchtime 1x -timeout 60m
func BenchmarkControlPlane(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	f := newFixture(b, ctx, Population{Namespace: "syncperf", Services: *flagServices, EndpointsPerService: *flagEndpoints})

	b.Run("startup", func(b *testing.B) {
		cg, err := harness.NewCgroup(b)
		if err != nil {
			b.Fatal(err)
		}
		var total Startup
		for range b.N {
			run := f.startKpr(b, cg)
			st, reader := f.measureStartup(b, ctx, run)
			reader.Close()
			run.stop()
			b.Log(st)
			total.Watching += st.Watching
			total.CachesSynced += st.CachesSynced
			total.Programmed += st.Programmed
			total.FirstSyncTook += st.FirstSyncTook
			total.Proc.CPU += st.Proc.CPU
			total.SyncCPU += st.SyncCPU
			total.Proc.PeakRSS = max(total.Proc.PeakRSS, st.Proc.PeakRSS)
		}
		n := float64(b.N)
		b.ReportMetric(float64(total.Programmed.Nanoseconds())/n, "ns/op")
		b.ReportMetric(total.Watching.Seconds()/n, "start->watching-s")
		b.ReportMetric(total.CachesSynced.Seconds()/n, "start->synced-s")
		b.ReportMetric(total.SyncedToProgrammed().Seconds()/n, "synced->programmed-s")
		b.ReportMetric(total.SyncCPU.Seconds()/n, "synced->programmed-cpu-s")
		b.ReportMetric(total.FirstSyncTook.Seconds()/n, "reconcile-s")
		b.ReportMetric(total.Proc.CPU.Seconds()/n, "cpu-s")
		b.ReportMetric(float64(total.Proc.PeakRSS)/(1<<20), "peak-rss-MiB")
	})

	b.Run("update", func(b *testing.B) { benchUpdates(ctx, b, f, 0) })

	// The same with a full reconcile every 2 s instead of kpr's default
	// 30 s, so that many updates queue behind one: the worst case an
	// update meets. resync-ms is what one such reconcile takes.
	b.Run("update-resync-2s", func(b *testing.B) {
		benchUpdates(ctx, b, f, 2*time.Second)
	})

	// Issue 7's scenario: one EndpointSlice switched again and again at a
	// steady pace while kpr runs a full reconcile every 5 s, so that
	// updates keep arriving during reconciles. The targets are max-ms <= 10
	// and p99-ms <= 5. With -syncperf.baseline-kpr the same runs first with
	// that binary, for a before/after ratio in one sitting.
	if *flagBaseline != "" {
		b.Run("update-churn-resync-5s-baseline", func(b *testing.B) { benchChurn(ctx, b, f, *flagBaseline) })
	}
	b.Run("update-churn-resync-5s", func(b *testing.B) { benchChurn(ctx, b, f, "") })
}

// churnPause is the time between two updates in benchChurn.
const churnPause = 300 * time.Millisecond

// benchChurn switches one Service's EndpointSlice -syncperf.churn-updates
// times, churnPause apart, against a kpr (binary, or this tree's if empty)
// with --sync-period=5s, and reports the latency percentiles, how many
// updates took over 5 ms (over-5ms) and, for a kpr that reconciles in
// steps, the longest step of all its periodic reconciles
// (longest-step-ms, from its debug log).
func benchChurn(ctx context.Context, b *testing.B, f *fixture, binary string) {
	cg, err := harness.NewCgroup(b)
	if err != nil {
		b.Fatal(err)
	}
	const syncPeriod = 5 * time.Second
	run := f.startKprBinary(b, cg, binary, "--sync-period="+syncPeriod.String(), "--log-level=debug")
	st, reader := f.measureStartup(b, ctx, run)
	b.Logf("kpr ready for updates: %v", st)
	// The first periodic reconcile after start-up, not the start-up's
	// own, is what the updates should meet; let one pass first.
	if err := pause(ctx, run.proc, syncPeriod); err != nil {
		b.Fatal(err)
	}
	s := f.svcs[len(f.svcs)/2]
	var fromReturn, fromSend []time.Duration
	slow := 0
	b.ResetTimer()
	for range b.N {
		for k := range *flagChurn {
			u, err := MeasureUpdate(ctx, f.client, reader, run.proc, s, k%len(s.Endpoints),
				ReplacementAddr(f.nextReplacement()), 10*time.Second)
			if err != nil {
				b.Fatalf("update %d: %v", k, err)
			}
			fromReturn = append(fromReturn, u.FromReturn)
			fromSend = append(fromSend, u.FromSend)
			if u.FromReturn > 5*time.Millisecond {
				slow++
				b.Logf("update %d took %v after the API's answer (done at %s)", k, u.FromReturn, time.Now().UTC().Format("15:04:05.000000"))
			}
			if err := pause(ctx, run.proc, churnPause); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	ret, send := Summarize(fromReturn), Summarize(fromSend)
	resyncs := FullSyncDurations(run.proc.Log())
	b.Logf("API answer -> maps: %v", ret)
	b.Logf("send -> maps:       %v", send)
	b.Logf("%d of %d updates over 5 ms; kpr logged %d full reconciles (the first is the start-up's)", slow, len(fromReturn), len(resyncs))
	if len(resyncs) < 2 {
		b.Fatalf("kpr logged %d full reconciles; the updates met none, so this measured nothing", len(resyncs))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(float64(ret.Mean.Nanoseconds()), "ns/op")
	b.ReportMetric(ms(ret.P50), "p50-ms")
	b.ReportMetric(ms(ret.P99), "p99-ms")
	b.ReportMetric(ms(ret.Max), "max-ms")
	b.ReportMetric(ms(send.P99), "send-p99-ms")
	b.ReportMetric(ms(send.Max), "send-max-ms")
	b.ReportMetric(float64(slow), "over-5ms")
	b.ReportMetric(ms(Summarize(resyncs[1:]).P50), "resync-ms")
	if steps := LongestReconcileSteps(run.proc.Log()); len(steps) > 0 {
		l := Summarize(steps)
		b.Logf("longest step of each periodic reconcile: %v", l)
		b.ReportMetric(ms(l.Max), "longest-step-ms")
	}
}

// benchUpdates times -syncperf.updates EndpointSlice updates per iteration
// against a kpr with the default sync period, or with syncPeriod if set.
func benchUpdates(ctx context.Context, b *testing.B, f *fixture, syncPeriod time.Duration) {
	cg, err := harness.NewCgroup(b)
	if err != nil {
		b.Fatal(err)
	}
	var kprArgs []string
	if syncPeriod > 0 {
		kprArgs = []string{"--sync-period=" + syncPeriod.String(), "--log-level=debug"}
	}
	run := f.startKpr(b, cg, kprArgs...)
	st, reader := f.measureStartup(b, ctx, run)
	b.Logf("kpr ready for updates: %v", st)
	var fromReturn, fromSend, api []time.Duration
	b.ResetTimer()
	for range b.N {
		for k := range *flagUpdates {
			u := f.update(b, ctx, run, reader, k)
			fromReturn = append(fromReturn, u.FromReturn)
			fromSend = append(fromSend, u.FromSend)
			api = append(api, u.APICall)
		}
	}
	b.StopTimer()
	ret, send, call := Summarize(fromReturn), Summarize(fromSend), Summarize(api)
	b.Logf("API answer -> maps: %v", ret)
	b.Logf("send -> maps:       %v", send)
	b.Logf("UPDATE call:        %v", call)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(float64(ret.Mean.Nanoseconds()), "ns/op")
	b.ReportMetric(ms(ret.P50), "p50-ms")
	b.ReportMetric(ms(ret.P90), "p90-ms")
	b.ReportMetric(ms(ret.P99), "p99-ms")
	b.ReportMetric(ms(ret.Max), "max-ms")
	b.ReportMetric(ms(send.P50), "send-p50-ms")
	b.ReportMetric(ms(send.P99), "send-p99-ms")
	b.ReportMetric(ms(call.P50), "api-p50-ms")
	if syncPeriod == 0 {
		return
	}
	// What a periodic full reconcile takes, from kpr's debug log. zap's
	// JSON logger samples a message logged over 100 times a second, which
	// the syncs during the updates are, so wait for a few reconciles on
	// an idle kpr. The first, from empty maps, is the start-up's.
	if err := pause(ctx, run.proc, 3*syncPeriod); err != nil {
		b.Fatal(err)
	}
	resyncs := FullSyncDurations(run.proc.Log())
	if len(resyncs) < 2 {
		b.Fatalf("kpr logged %d full reconciles with --sync-period=%v; want the start-up's and periodic ones", len(resyncs), syncPeriod)
	}
	r := Summarize(resyncs[1:])
	b.Logf("periodic full reconciles: %v", r)
	b.ReportMetric(ms(r.P50), "resync-ms")
}
