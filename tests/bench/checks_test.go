package bench

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
)

// idleProxy is a process that runs in the node namespace and programs
// nothing: the stand-in for a proxy that silently serves nothing.
type idleProxy struct{ cmd *exec.Cmd }

func (p *idleProxy) PID() int                     { return p.cmd.Process.Pid }
func (p *idleProxy) Exited() (bool, error)        { return p.cmd.ProcessState != nil, nil }
func (p *idleProxy) LogTail() string              { return "" }
func (p *idleProxy) BPFMapBytes() (*int64, error) { return nil, nil }
func (p *idleProxy) CgroupPath() string           { return "" }
func (p *idleProxy) Stop() error {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	return nil
}

// TestColdStartFailsWhenNothingServes checks that the cold-start phase
// cannot be passed by a proxy that programs nothing: it must end as "did
// not converge", never with a time.
func TestColdStartFailsWhenNothingServes(t *testing.T) {
	harness.RequireRoot(t)
	infra, err := StartInfra(t)
	if err != nil {
		t.Fatal(err)
	}
	wl, err := NewWorkload(context.Background(), infra.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := wl.Grow(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	env, err := infra.NewNode(t)
	if err != nil {
		t.Fatal(err)
	}
	idle := &idleProxy{cmd: exec.Command("sleep", "600")}
	if err := harness.StartCommand(env.Node.NetNS, idle.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idle.Stop() })

	run := &Run{Proxy: "idle", Services: wl.Len()}
	m := &measurement{
		cfg:   Config{ColdStartTimeout: func(int) time.Duration { return 2 * time.Second }},
		wl:    wl,
		run:   run,
		proxy: idle,
	}
	if err := m.coldStart(env, time.Now()); err != nil {
		t.Fatal(err)
	}
	if run.ColdStart.Converged || run.ColdStart.ServicesVerified != 0 {
		t.Fatalf("a proxy that programs nothing passed the cold start: %+v", run.ColdStart)
	}
	if !strings.Contains(run.ColdStart.Note, "did not converge within 2s") {
		t.Errorf("note %q does not say it did not converge", run.ColdStart.Note)
	}
	if run.ColdStart.Resources.PeakRSSBytes <= 0 {
		t.Errorf("no RSS recorded at the timeout: %+v", run.ColdStart.Resources)
	}
	// The backends themselves answer: the failure is the missing proxy,
	// not a broken node.
	err = harness.Do(env.Node.NetNS, func() error {
		_, who, err := connectEcho(netip.AddrPortFrom(env.Main[3].IPv4, targetPort), time.Second)
		if err == nil && who != env.Main[3].Name {
			t.Errorf("pod %s answered as %q", env.Main[3].Name, who)
		}
		return err
	})
	if err != nil {
		t.Fatalf("a backend pod does not answer directly: %v", err)
	}
}

// TestValidateJSON checks that a results file missing a field, or holding
// a converged run without numbers, is rejected, and a complete one passes.
func TestValidateJSON(t *testing.T) {
	maps := int64(4096)
	good := Results{Schema: resultsSchema, Runs: []Run{{
		Proxy: ProxyKPR, Services: 3, EndpointsPerService: 10, BPFMapBytes: &maps, PeakRSSBytes: 1 << 20,
		ColdStart: ColdStart{Converged: true, Seconds: 0.5, ServicesVerified: 3,
			Resources: Resources{WallSeconds: 0.5, PeakRSSBytes: 1 << 20}},
		ConnLatency: &ConnLatency{Samples: 10, First: Percentiles{P50: 100, P99: 200}, Last: Percentiles{P50: 100, P99: 200},
			Direct: Percentiles{P50: 90, P99: 180}, LastRatioP50: 1.1},
		Programming: &Programming{Updates: 2, Latencies: []float64{5, 7}, P50: 5, P90: 7, P99: 7},
	}}}
	dir := t.TempDir()
	write := func(name string, v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := ValidateJSON(write("good.json", good)); err != nil {
		t.Fatalf("complete results rejected: %v", err)
	}

	// A field missing from a nested object.
	var raw map[string]any
	b, _ := json.Marshal(good)
	_ = json.Unmarshal(b, &raw)
	delete(raw["runs"].([]any)[0].(map[string]any)["programming"].(map[string]any), "p99Ms")
	if err := ValidateJSON(write("missing.json", raw)); err == nil || !strings.Contains(err.Error(), "p99Ms") {
		t.Errorf("missing runs[0].programming.p99Ms not reported: %v", err)
	}

	// A converged run whose proxy served nothing measurable.
	empty := good
	empty.Runs = []Run{good.Runs[0]}
	empty.Runs[0].ConnLatency = &ConnLatency{}
	empty.Runs[0].BPFMapBytes = nil
	err := ValidateJSON(write("empty.json", empty))
	if err == nil || !strings.Contains(err.Error(), "connection latency") || !strings.Contains(err.Error(), "BPF map") {
		t.Errorf("empty measurements not reported: %v", err)
	}
}
