package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kubeproxy"
)

// Config is one benchmark run's parameters.
type Config struct {
	// Sizes are the Service counts, ascending; each has 10 endpoints.
	Sizes []int
	// Updates is how many EndpointSlice updates the programming phase
	// makes; Samples how many connections each connection-latency series
	// gets.
	Updates, Samples int
	// Proxies to compare, from AllProxies.
	Proxies []string
	// MinSyncPeriod is given to every proxy.
	MinSyncPeriod time.Duration
	// ColdStartTimeout bounds the cold start at n Services.
	ColdStartTimeout func(n int) time.Duration
	// MustConverge: kube-proxy not finishing its cold start at up to this
	// many Services fails the test; above it, it is a reported result
	// ("did not converge within T"). kpr must always converge.
	MustConverge int
	// OutDir receives results.json and results.md.
	OutDir string
	// DocPath, if set, is regenerated (docs/benchmarks.md).
	DocPath string
	// Command is how to reproduce the run, for the report.
	Command string
	// LogDir, if set, keeps every proxy's log and configuration under
	// LogDir/<proxy>-<services>/; otherwise they go with the test.
	LogDir string
}

// DefaultColdStartTimeout allows a minute plus 20ms per Service (about
// 4 minutes at 10,000 Services, 18 at 50,000).
func DefaultColdStartTimeout(n int) time.Duration {
	return time.Minute + time.Duration(n)*20*time.Millisecond
}

// updateTimeout bounds one EndpointSlice update's propagation.
func updateTimeout(n int) time.Duration {
	return 30*time.Second + time.Duration(n)*3*time.Millisecond
}

// RunBenchmark benchmarks every proxy at every size and writes the results. It is
// the whole harness: the test and `make bench` call it with different
// Configs.
func RunBenchmark(t *testing.T, cfg Config) *Results {
	harness.RequireRoot(t)
	began := time.Now()
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))

	// Registered first, so it runs last: after every proxy, namespace and
	// the cluster are gone.
	before, err := hostFirewall()
	if err != nil {
		t.Fatal(err)
	}
	res := &Results{Schema: resultsSchema, StartedAt: began.UTC(), Command: cfg.Command,
		Settings: Settings{Sizes: cfg.Sizes, EndpointsPerService: backendsPerGroup, Updates: cfg.Updates,
			Samples: cfg.Samples, Proxies: cfg.Proxies, MinSyncPeriod: cfg.MinSyncPeriod.String(),
			KubeProxyMinSyncPeriod: kubeProxyMinSync(cfg.MinSyncPeriod).String(),
			NotBuilt:               notMeasured}}
	t.Cleanup(func() {
		if err := checkHostUnchanged(before); err != nil {
			t.Error(err)
		}
	})

	toolsDir, err := kubeproxy.ToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	res.Machine = machine()
	res.Versions = versions(toolsDir)

	// The client is the test process: its sockets are the ones kpr's
	// programs see, so the cgroup kpr attaches to holds the test process.
	cg, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.EnterProcess(); err != nil {
		t.Fatal(err)
	}
	infra, err := StartInfra(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	wl, err := NewWorkload(ctx, infra.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}

	failedAt := map[string]int{} // proxy -> the size it did not converge at
	for _, n := range cfg.Sizes {
		grown := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 10*time.Minute+time.Duration(n)*20*time.Millisecond)
		err := wl.Grow(pctx, n)
		cancel()
		if err != nil {
			t.Fatalf("create %d Services: %v", n, err)
		}
		res.Populate = append(res.Populate, Populate{Services: n, Seconds: time.Since(grown).Seconds()})
		log.Info("services in place", zap.Int("services", n), zap.Duration("took", time.Since(grown)))

		for _, proxy := range cfg.Proxies {
			run := Run{Proxy: proxy, Services: n, EndpointsPerService: backendsPerGroup}
			if at, ok := failedAt[proxy]; ok {
				run.Skipped = fmt.Sprintf("did not converge at %d Services", at)
				res.Runs = append(res.Runs, run)
				continue
			}
			m := &measurement{cfg: cfg, infra: infra, wl: wl, cgroup: cg.Path, toolsDir: toolsDir, host: before, log: log, run: &run}
			t.Run(fmt.Sprintf("%s/services=%d", proxy, n), m.measure)
			res.Runs = append(res.Runs, run)
			if !run.ColdStart.Converged {
				failedAt[proxy] = n
				if proxy == ProxyKPR || n <= cfg.MustConverge {
					t.Errorf("%s did not serve all %d Services: %s", proxy, n, run.ColdStart.Note)
				}
			}
		}
	}
	res.Targets = evaluateTargets(res.Runs)
	res.HostUnchanged = checkHostUnchanged(before) == nil
	res.TotalSeconds = time.Since(began).Seconds()
	if err := writeOutputs(res, cfg); err != nil {
		t.Fatal(err)
	}
	return res
}

// measurement is one proxy at one size.
type measurement struct {
	cfg      Config
	infra    *Infra
	wl       *Workload
	cgroup   string
	toolsDir string
	host     hostState
	log      *zap.Logger
	run      *Run
	proxy    runningProxy
}

func (m *measurement) measure(t *testing.T) {
	env, err := m.infra.NewNode(t)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.infra.checkAPIReachable(env); err != nil {
		t.Fatal(err)
	}
	// Nothing may serve the Services before the proxy under test starts:
	// otherwise a proxy that programs nothing would pass on what an
	// earlier run left behind.
	err = harness.Do(env.Node.NetNS, func() error {
		if _, who, err := connectEcho(m.wl.Last(), 300*time.Millisecond); err == nil {
			return fmt.Errorf("%s answered from pod %s before any proxy ran in %s", m.wl.Last(), who, env.Node.NetNS.Name)
		} else if !isUnserved(err) {
			return fmt.Errorf("checking that %s is not served yet: %w", m.wl.Last(), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	logDir := t.TempDir()
	if m.cfg.LogDir != "" {
		logDir = filepath.Join(m.cfg.LogDir, fmt.Sprintf("%s-%d", m.run.Proxy, m.run.Services))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	proxyCgroup, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	m.proxy, err = startProxy(m.run.Proxy, env, proxySettings{
		ToolsDir: m.toolsDir, Kubeconfig: m.infra.NodeKubeconfig, CgroupRoot: m.cgroup,
		MinSyncPeriod: m.cfg.MinSyncPeriod, Services: m.run.Services, LogDir: logDir, Cgroup: proxyCgroup,
	})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	t.Cleanup(func() {
		if err := m.proxy.Stop(); err != nil {
			t.Errorf("stopping %s: %v", m.run.Proxy, err)
		}
		if err := checkHostUnchanged(m.host); err != nil {
			t.Error(err)
		}
	})

	if err := m.coldStart(env, started); err != nil {
		t.Fatalf("cold start: %v\n%s log:\n%s", err, m.run.Proxy, m.proxy.LogTail())
	}
	m.log.Info("cold start", zap.String("proxy", m.run.Proxy), zap.Int("services", m.run.Services),
		zap.Bool("converged", m.run.ColdStart.Converged), zap.Float64("seconds", m.run.ColdStart.Seconds),
		zap.Float64("cpuSeconds", m.run.ColdStart.Resources.CPUSeconds+m.run.ColdStart.Resources.ChildrenCPUSeconds))
	m.run.PeakRSSBytes = m.run.ColdStart.Resources.PeakRSSBytes
	if !m.run.ColdStart.Converged {
		return
	}
	if m.run.BPFMapBytes, err = m.proxy.BPFMapBytes(); err != nil {
		t.Fatal(err)
	}
	if err := m.connLatency(env); err != nil {
		t.Fatalf("connection latency: %v\nconntrack statistics of the node:\n%s\n%s log:\n%s", err, conntrackStats(env), m.run.Proxy, m.proxy.LogTail())
	}
	m.run.PeakRSSBytes = max(m.run.PeakRSSBytes, m.run.ConnLatency.Resources.PeakRSSBytes)
	if err := m.programming(env); err != nil {
		t.Fatalf("programming latency: %v\nconntrack statistics of the node:\n%s\n%s log:\n%s", err, conntrackStats(env), m.run.Proxy, m.proxy.LogTail())
	}
	m.run.PeakRSSBytes = max(m.run.PeakRSSBytes, m.run.Programming.Resources.PeakRSSBytes)
	g := m.run.Programming
	m.log.Info("measured", zap.String("proxy", m.run.Proxy), zap.Int("services", m.run.Services),
		zap.Float64("connLastP50us", m.run.ConnLatency.Last.P50), zap.Float64("connDirectP50us", m.run.ConnLatency.Direct.P50),
		zap.Float64("progP50ms", g.P50), zap.Float64("progP99ms", g.P99), zap.Int("timedOut", g.TimedOut))
	if g.TimedOut > 0 {
		t.Errorf("%s: an EndpointSlice update did not reach the dataplane within %s", m.run.Proxy, updateTimeout(m.run.Services))
	}
}

// coldStart waits until the last-created Service answers, then checks
// every Service once (retrying those that do not answer yet).
func (m *measurement) coldStart(env *NodeEnv, started time.Time) error {
	cs := &m.run.ColdStart
	timeout := m.cfg.ColdStartTimeout(m.run.Services)
	cs.TimeoutSeconds = timeout.Seconds()
	meter, err := startPhase(m.proxy.PID(), m.proxy.CgroupPath())
	if err != nil {
		return err
	}
	deadline := started.Add(timeout)
	return harness.Do(env.Node.NetNS, func() error {
		last := m.wl.Last()
		var lastErr error
		for {
			if exited, err := m.proxy.Exited(); exited {
				cs.Note = fmt.Sprintf("%s exited during its cold start (%v)", m.run.Proxy, err)
				cs.Resources, _ = meter.end()
				return nil
			}
			_, _, err := connectEcho(last, 200*time.Millisecond)
			if err == nil {
				break
			}
			lastErr = err
			if time.Now().After(deadline) {
				cs.Resources, err = meter.end()
				cs.Note = fmt.Sprintf("did not converge within %s: the last-created Service %s never answered (last error: %v); CPU %.1fs, peak RSS %.0f MiB at that point",
					timeout, last, lastErr, cs.Resources.CPUSeconds+cs.Resources.ChildrenCPUSeconds, float64(cs.Resources.PeakRSSBytes)/(1<<20))
				return err
			}
			// 5ms resolution for the first two seconds, then 50ms: each
			// unanswered probe pins a client port in conntrack for 2
			// minutes under kube-proxy (see clientPortLow).
			if time.Since(started) < 2*time.Second {
				time.Sleep(5 * time.Millisecond)
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
		cs.LastServiceSeconds = time.Since(started).Seconds()
		cs.Seconds = cs.LastServiceSeconds
		if cs.Resources, err = meter.end(); err != nil {
			return err
		}
		for i := range m.wl.Len() {
			svc := m.wl.Service(i)
			late := false
			for {
				_, _, err := connectEcho(svc, time.Second)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					cs.Note = fmt.Sprintf("Service %d (%s) never answered within %s although the last-created one did: %v", i, svc, timeout, err)
					return nil
				}
				late = true
				time.Sleep(5 * time.Millisecond)
			}
			if late {
				cs.LateServices++
				cs.Seconds = time.Since(started).Seconds()
			}
			cs.ServicesVerified++
		}
		cs.Converged = true
		return nil
	})
}

// connLatency measures connect+echo to the first- and last-created
// ClusterIP and to a backend pod directly, interleaved so that all three
// series see the same machine load.
func (m *measurement) connLatency(env *NodeEnv) error {
	// The three series, in rotating order. A ClusterIP spreads its
	// connections over the 10 main pods, so the direct series walks
	// through the same pods; want is the pod that must answer it.
	type target struct {
		to   netip.AddrPort
		want string
	}
	targetOf := func(series, i int) target {
		switch series {
		case 0:
			return target{to: m.wl.First()}
		case 1:
			return target{to: m.wl.Last()}
		}
		pod := env.Main[((i%backendsPerGroup)+backendsPerGroup)%backendsPerGroup]
		return target{netip.AddrPortFrom(pod.IPv4, targetPort), pod.Name}
	}
	var series [3][]time.Duration
	const connTimeout = 2 * time.Second
	failures := 0
	meter, err := startPhase(m.proxy.PID(), m.proxy.CgroupPath())
	if err != nil {
		return err
	}
	err = harness.Do(env.Node.NetNS, func() error {
		const warmup = 50
		for i := -warmup; i < m.cfg.Samples; i++ {
			for k := range 3 {
				idx := (i + warmup + k) % 3
				a := targetOf(idx, i)
				d, who, err := connectEcho(a.to, connTimeout)
				if isUnserved(err) && i >= 0 {
					// A lost SYN under load is a result, not a harness
					// failure: counted, and recorded at the timeout (a
					// lower bound of what the client waited).
					failures++
					if failures > max(3, m.cfg.Samples/100) {
						return fmt.Errorf("%d connections failed (more than 1%% of %d samples), the last to %s: %w", failures, m.cfg.Samples, a.to, err)
					}
					series[idx] = append(series[idx], connTimeout)
					continue
				}
				if err != nil {
					return err
				}
				if a.want != "" && who != a.want {
					return fmt.Errorf("direct connection to %s answered by %s, want %s", a.to, who, a.want)
				}
				if !strings.HasPrefix(who, mainPrefix) && !strings.HasPrefix(who, altPrefix) {
					return fmt.Errorf("%s answered by unknown pod %q", a.to, who)
				}
				if i >= 0 {
					series[idx] = append(series[idx], d)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	c := &ConnLatency{Samples: m.cfg.Samples, Failures: failures, First: percentilesOf(series[0]), Last: percentilesOf(series[1]), Direct: percentilesOf(series[2])}
	c.LastRatioP50, c.LastRatioP99 = c.Last.P50/c.Direct.P50, c.Last.P99/c.Direct.P99
	c.FirstRatioP50, c.FirstRatioP99 = c.First.P50/c.Direct.P50, c.First.P99/c.Direct.P99
	if c.Resources, err = meter.end(); err != nil {
		return err
	}
	m.run.ConnLatency = c
	return nil
}

// programming switches the probe Service's slice Updates times, one after
// another, each time timing from the API write until a connection from
// the node reaches the new backend set. A timed-out update ends the phase:
// after it, which set is served is no longer known.
func (m *measurement) programming(env *NodeEnv) error {
	g := &Programming{}
	limit := updateTimeout(m.run.Services)
	meter, err := startPhase(m.proxy.PID(), m.proxy.CgroupPath())
	if err != nil {
		return err
	}
	var writes []time.Duration
	err = harness.Do(env.Node.NetNS, func() error {
		probe := m.wl.First()
		for range m.cfg.Updates {
			g.Updates++
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			start := time.Now()
			group, err := m.wl.SwitchProbe(ctx)
			cancel()
			if err != nil {
				return err
			}
			writes = append(writes, time.Since(start))
			for {
				_, who, err := connectEcho(probe, time.Second)
				if err == nil && strings.HasPrefix(who, group) {
					g.Latencies = append(g.Latencies, float64(time.Since(start).Microseconds())/1e3)
					break
				}
				if time.Since(start) > limit {
					g.TimedOut++
					return nil
				}
				time.Sleep(time.Millisecond)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	g.P50, g.P90, g.P99 = percentile(g.Latencies, 50), percentile(g.Latencies, 90), percentile(g.Latencies, 99)
	g.Max = percentile(g.Latencies, 100)
	g.WriteP50 = percentile(millis(writes), 50)
	if g.Resources, err = meter.end(); err != nil {
		return err
	}
	m.run.Programming = g
	return nil
}

// conntrackStats is `conntrack -S` inside the node namespace (drops and
// insert failures explain lost SYNs under kube-proxy), for error messages.
func conntrackStats(env *NodeEnv) string {
	out, err := exec.Command("nsenter", "--net="+env.Node.NetNS.Path, "conntrack", "-S").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(conntrack -S failed: %v %s)", err, out)
	}
	return string(out)
}

func millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d.Microseconds()) / 1e3
	}
	return out
}

// repoRoot is the repository's top directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
