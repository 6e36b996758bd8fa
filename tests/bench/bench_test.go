package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Flags, for `make bench` (go test ./tests/bench -args ...). Without them
// the test is the quick mode that `make test` runs: 100 Services, few
// iterations, outputs in a temporary directory.
var (
	flagSizes   = flag.String("sizes", "100", "comma-separated Service counts, ascending (each with 10 endpoints)")
	flagUpdates = flag.Int("updates", 10, "EndpointSlice updates in the programming-latency phase")
	flagSamples = flag.Int("samples", 100, "connections per connection-latency series")
	flagProxies = flag.String("proxies", strings.Join(AllProxies, ","), "proxies to compare")
	flagMinSync = flag.Duration("min-sync-period", 0, "min sync period given to every proxy (kube-proxy's default is 1s, kpr's 0)")
	flagMust    = flag.Int("must-converge", 1000, "fail if kube-proxy does not finish its cold start at up to this many Services (above: reported)")
	flagOut     = flag.String("out", "", "directory for results.json and results.md (make bench-plots draws the plots from it), relative to the repository root (default: a temporary directory)")
	flagDoc     = flag.String("doc", "", "regenerate this document (e.g. docs/benchmarks.md), relative to the repository root")
	flagLogs    = flag.String("logs", "", "keep every proxy's log and configuration in this directory")
	flagRender  = flag.String("render", "", "measure nothing: re-judge the targets of this results.json and rewrite -out (default: its directory) and -doc from it")
)

// TestProxyBenchmark runs the benchmark. In its default quick mode it
// checks, end to end, that every proxy serves the Services (a proxy that
// programs nothing fails it) and that the results file holds every field.
func TestProxyBenchmark(t *testing.T) {
	if *flagRender != "" {
		rerender(t)
		return
	}
	cfg := Config{
		Updates: *flagUpdates, Samples: *flagSamples, MinSyncPeriod: *flagMinSync,
		MustConverge: *flagMust, ColdStartTimeout: DefaultColdStartTimeout,
	}
	for _, s := range strings.Split(*flagSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			t.Fatalf("-sizes: %q is not a positive number", s)
		}
		if len(cfg.Sizes) > 0 && n <= cfg.Sizes[len(cfg.Sizes)-1] {
			t.Fatalf("-sizes must be ascending, got %s", *flagSizes)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	for _, p := range strings.Split(*flagProxies, ",") {
		cfg.Proxies = append(cfg.Proxies, strings.TrimSpace(p))
	}
	if cfg.Updates < 1 || cfg.Samples < 1 {
		t.Fatal("-updates and -samples must be at least 1")
	}
	cfg.OutDir = t.TempDir()
	if *flagOut != "" {
		cfg.OutDir = fromRoot(*flagOut)
	}
	if *flagDoc != "" {
		cfg.DocPath = fromRoot(*flagDoc)
	}
	if *flagLogs != "" {
		cfg.LogDir = fromRoot(*flagLogs)
	}
	cfg.Command = reproduceCommand()

	res := RunBenchmark(t, cfg)
	if t.Failed() {
		return
	}
	// RunBenchmark validated the JSON it wrote; check the quick mode's substance
	// too: every proxy was measured at every size.
	for _, r := range res.Runs {
		if r.Skipped != "" || !r.ColdStart.Converged {
			continue
		}
		if r.ConnLatency == nil || r.Programming == nil {
			t.Errorf("%s at %d Services: phases missing", r.Proxy, r.Services)
		}
	}
	if got, want := len(res.Runs), len(cfg.Sizes)*len(cfg.Proxies); got != want {
		t.Errorf("%d runs recorded, want %d", got, want)
	}
	t.Logf("results in %s:\n%s\n%s", cfg.OutDir, markdownTable(res), targetsTable(res))
}

// rerender rewrites the outputs of an earlier run, e.g. after a change to
// the report's wording or the targets (`make bench-plots` redraws the plots).
func rerender(t *testing.T) {
	path := fromRoot(*flagRender)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	res.Targets = evaluateTargets(res.Runs)
	cfg := Config{OutDir: filepath.Dir(path)}
	if *flagOut != "" {
		cfg.OutDir = fromRoot(*flagOut)
	}
	if *flagDoc != "" {
		cfg.DocPath = fromRoot(*flagDoc)
	}
	if err := writeOutputs(&res, cfg); err != nil {
		t.Fatal(err)
	}
}

func fromRoot(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(repoRoot(), p)
}

// reproduceCommand is the go test command line for the flags in effect.
func reproduceCommand() string {
	timeout := "30m"
	if f := flag.Lookup("test.timeout"); f != nil && f.Value.String() != "0s" {
		d, _ := time.ParseDuration(f.Value.String())
		timeout = d.String()
	}
	args := []string{"go test ./tests/bench -run '^TestProxyBenchmark$' -count=1 -v -timeout " + timeout + " -args",
		"-sizes=" + *flagSizes, fmt.Sprintf("-updates=%d", *flagUpdates), fmt.Sprintf("-samples=%d", *flagSamples)}
	if *flagProxies != strings.Join(AllProxies, ",") {
		args = append(args, "-proxies="+*flagProxies)
	}
	if *flagMinSync != 0 {
		args = append(args, "-min-sync-period="+flagMinSync.String())
	}
	if *flagOut != "" {
		args = append(args, "-out="+*flagOut)
	}
	if *flagDoc != "" {
		args = append(args, "-doc="+*flagDoc)
	}
	if *flagOut != "" {
		// The plots are drawn outside this module (tests/bench/plot).
		args = append(args, "&& make bench-plots BENCH_OUT="+*flagOut)
	}
	return strings.Join(args, " ")
}
