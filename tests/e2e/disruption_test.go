package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// probeLoop probes one Service address over and over from a goroutine and
// records every failure, to show that traffic never stops while kpr or the
// API server is away.
type probeLoop struct {
	what string
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	ok       int
	failures []string
	lastOK   time.Time
}

// startProbing probes addr with probe every interval until stop. A probe
// answered by a pod outside allowed counts as a failure.
func startProbing(ns *harness.NetNS, addr netip.AddrPort, probe prober, interval time.Duration, allowed ...string) *probeLoop {
	p := &probeLoop{what: addr.String(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			who, err := probe(ns, addr)
			if err == nil && !contains(allowed, who) {
				err = fmt.Errorf("answered by %s, want one of %v", who, allowed)
			}
			p.mu.Lock()
			if err != nil {
				p.failures = append(p.failures, time.Now().Format("15:04:05.000")+" "+err.Error())
			} else {
				p.ok++
				p.lastOK = time.Now()
			}
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// okSince reports how many probes have succeeded so far and when the last
// one did.
func (p *probeLoop) okSince() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok, p.lastOK
}

// finish stops the loop and fails t if any probe failed or none ran.
func (p *probeLoop) finish(t *testing.T) {
	t.Helper()
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("%s: %d probes succeeded, %d failed", p.what, p.ok, len(p.failures))
	if len(p.failures) > 0 {
		shown := p.failures
		if len(shown) > 10 {
			shown = shown[:10]
		}
		t.Errorf("%d of %d probes of %s failed; first ones:\n%s", len(p.failures), p.ok+len(p.failures), p.what, strings.Join(shown, "\n"))
	}
	if p.ok == 0 {
		t.Errorf("no probe of %s succeeded", p.what)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestKprRestart kills kpr with SIGKILL under continuous connections and
// starts it again: no connection fails, and the new kpr adopts the pinned
// maps as they are instead of rebuilding them.
func TestKprRestart(t *testing.T) {
	f := newFixture(t)
	ns := f.namespace(t, "restart")
	web := f.createService(t, kubeobj.DualStack(kubeobj.Service(ns, "web", tcp80)))
	f.setEndpoints(t, web, v4, f.eps("pod-a", "pod-b", "pod-c")...)
	f.setEndpoints(t, web, v6, f.ep("pod-a", v6), f.ep("pod-b", v6))
	dns := f.createService(t, kubeobj.Service(ns, "dns", kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}))
	f.setEndpoints(t, dns, v4, f.eps("pod-c", "pod-d")...)
	webVIP, webVIP6, dnsVIP := clusterIP(t, web, v1.IPv4Protocol, 80), clusterIP(t, web, v1.IPv6Protocol, 80), clusterIP(t, dns, v1.IPv4Protocol, 53)
	waitServes(t, tcpWho, f.node.NetNS, webVIP, "pod-a", "pod-b", "pod-c")
	waitServes(t, tcpWho, f.node.NetNS, webVIP6, "pod-a", "pod-b")
	waitServes(t, udpWho, f.node.NetNS, dnsVIP, "pod-c", "pod-d")

	before := f.dumpJSON(t)
	rawBefore := rawMaps(t, f.kpr)
	wantEntries := 0
	for _, s := range f.dump(t) {
		wantEntries += 1 + len(s.Backends) // the master and one slot per backend
	}

	loops := []*probeLoop{
		startProbing(f.node.NetNS, webVIP, tcpWho, 5*time.Millisecond, "pod-a", "pod-b", "pod-c"),
		startProbing(f.pod("pod-d").NetNS, webVIP6, tcpWho, 5*time.Millisecond, "pod-a", "pod-b"),
		startProbing(f.node.NetNS, dnsVIP, udpWho, 5*time.Millisecond, "pod-c", "pod-d"),
	}
	waitProbesRun := func(what string) {
		t.Helper()
		for _, l := range loops {
			n0, _ := l.okSince()
			waitUntil(t, convergeTimeout, what, func() error {
				if n, _ := l.okSince(); n < n0+5 {
					return errNotYet
				}
				return nil
			})
		}
	}
	waitProbesRun("probes run before the kill")

	if err := f.kpr.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// With no kpr at all, the pinned programs and maps keep serving.
	waitProbesRun("probes succeed while kpr is dead")
	if during := f.dumpJSON(t); during != before {
		t.Errorf("the maps changed while kpr was dead:\nbefore %s\nafter  %s", before, during)
	}
	if err := f.kpr.Restart(); err != nil {
		t.Fatal(err)
	}
	f.waitHealthy()
	t.Logf("kpr was away for %s", time.Since(killed))

	// Before any API change the new kpr has found everything in place.
	if after := f.dumpJSON(t); after != before {
		t.Errorf("kpr dump changed across the restart:\nbefore %s\nafter  %s", before, after)
	}
	if rawAfter := rawMaps(t, f.kpr); rawAfter != rawBefore {
		t.Errorf("the raw maps (backend ids, slots, reverse-NAT ids) changed across the restart:\nbefore %s\nafter  %s", rawBefore, rawAfter)
	}
	entries, backends := adopted(t, f.kpr.Log())
	if entries != wantEntries || backends == 0 {
		t.Errorf("the restarted kpr adopted %d service entries and %d backends; want the %d entries the maps held", entries, backends, wantEntries)
	}
	waitProbesRun("probes run after the restart")
	for _, l := range loops {
		l.finish(t)
	}

	// And the new kpr is in charge: changes reach the dataplane.
	f.setEndpoints(t, web, v4, f.eps("pod-d")...)
	waitServes(t, tcpWho, f.node.NetNS, webVIP, "pod-d")
	f.requireRunning(t)
}

// adopted returns the counts of the last "adopted dataplane" line of kpr's
// log (cmd/kpr/run.go), i.e. of the latest start.
func adopted(t *testing.T, log string) (entries, backends int) {
	t.Helper()
	const msg = "adopted dataplane"
	i := strings.LastIndex(log, msg)
	if i < 0 {
		t.Fatalf("kpr did not log %q; log:\n%s", msg, lastLines(log, 30))
	}
	line, _, _ := strings.Cut(log[i+len(msg):], "\n")
	var fields struct {
		ServiceEntries *int `json:"serviceEntries"`
		Backends       *int `json:"backends"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &fields); err != nil || fields.ServiceEntries == nil || fields.Backends == nil {
		t.Fatalf("cannot read the counts of kpr's %q line %q: %v", msg, line, err)
	}
	return *fields.ServiceEntries, *fields.Backends
}

// rawMaps dumps the maps that hold ids with bpftool: a rebuilt dataplane
// would show new backend ids, slots or reverse-NAT ids even where kpr
// dump looks the same. Empty if bpftool is not installed.
func rawMaps(t *testing.T, p *kprproc.Process) string {
	t.Helper()
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Log("bpftool not installed: comparing kpr dump only")
		return ""
	}
	var b strings.Builder
	for _, m := range []string{"kpr_services", "kpr_backends", "kpr_rev_nat"} {
		out, err := exec.Command("bpftool", "-j", "map", "dump", "pinned", filepath.Join(p.BPFRoot, m)).Output()
		if err != nil {
			t.Fatalf("bpftool map dump %s: %v", m, err)
		}
		var entries []json.RawMessage
		if err := json.Unmarshal(out, &entries); err != nil {
			t.Fatalf("parse bpftool dump of %s: %v", m, err)
		}
		// bpftool lists hash maps in bucket order, which is stable for the
		// same map with the same content.
		fmt.Fprintf(&b, "%s (%d entries): %s\n", m, len(entries), out)
	}
	return b.String()
}

// TestAPIServerOutage stops the API server for 30 s. Services keep working
// throughout, kpr keeps running, and afterwards it catches up with a change
// made just before the outage and with changes made after it.
func TestAPIServerOutage(t *testing.T) {
	f := newFixture(t)
	ns := f.namespace(t, "outage")
	steady := f.createService(t, kubeobj.Service(ns, "steady", tcp80,
		kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}))
	f.setEndpoints(t, steady, v4, f.eps("pod-a", "pod-b")...)
	moving := f.createService(t, kubeobj.Service(ns, "moving", tcp80))
	f.setEndpoints(t, moving, v4, f.eps("pod-c")...)
	steadyVIP, steadyDNS, movingVIP := clusterIP(t, steady, v1.IPv4Protocol, 80), clusterIP(t, steady, v1.IPv4Protocol, 53), clusterIP(t, moving, v1.IPv4Protocol, 80)
	waitServes(t, tcpWho, f.node.NetNS, steadyVIP, "pod-a", "pod-b")
	waitServes(t, udpWho, f.node.NetNS, steadyDNS, "pod-a", "pod-b")
	waitServes(t, tcpWho, f.node.NetNS, movingVIP, "pod-c")

	loops := []*probeLoop{
		startProbing(f.node.NetNS, steadyVIP, tcpWho, 50*time.Millisecond, "pod-a", "pod-b"),
		startProbing(f.pod("pod-d").NetNS, steadyDNS, udpWho, 50*time.Millisecond, "pod-a", "pod-b"),
		// The change below may or may not reach kpr before the outage.
		startProbing(f.node.NetNS, movingVIP, tcpWho, 50*time.Millisecond, "pod-c", "pod-d"),
	}

	// A change kpr may miss: written right before the API server goes.
	f.setEndpoints(t, moving, v4, f.eps("pod-d")...)
	if err := f.cluster.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	const outage = 30 * time.Second
	down := time.Now()
	healthyDuring := true
	for time.Since(down) < outage {
		f.requireRunning(t)
		// Nothing is queued, so nothing is late: kube-proxy's /healthz
		// stays 200 while the API server is away, and so must kpr's.
		if code, err := f.healthz(); healthyDuring && (err != nil || code != 200) {
			t.Errorf("/healthz during the outage = %d, %v; want 200", code, err)
			healthyDuring = false
		}
		time.Sleep(time.Second)
	}
	if err := f.cluster.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server was down for %s", time.Since(down))
	for _, l := range loops {
		n, last := l.okSince()
		if time.Since(last) > 5*time.Second {
			t.Errorf("probes of %s last succeeded at %s (%d so far)", l.what, last.Format("15:04:05.000"), n)
		}
	}

	// Changes reach kpr again once its watches are back. client-go alone
	// would retry a refused watch only after a backoff grown to [30s, 60s)
	// by the end of a 30s outage (tools/cache/reflector.go), as kube-proxy
	// does; kpr's client keeps those calls waiting for the API server
	// instead (package apiclient), so it catches up within seconds.
	const catchUp = 20 * time.Second
	back := time.Now()
	fresh := f.createService(t, kubeobj.Service(ns, "fresh", tcp80))
	f.setEndpoints(t, fresh, v4, f.eps("pod-b")...)
	waitServesWithin(t, catchUp, tcpWho, f.node.NetNS, clusterIP(t, fresh, v1.IPv4Protocol, 80), "pod-b")
	t.Logf("a Service created after the outage was served %s after the API server returned", time.Since(back))
	// The change written just before the outage is in as well.
	requireServes(t, tcpWho, f.node.NetNS, movingVIP, "pod-d")
	for _, l := range loops {
		l.finish(t)
	}
	f.setEndpoints(t, steady, v4, f.eps("pod-a", "pod-b", "pod-c")...)
	waitServes(t, tcpWho, f.node.NetNS, steadyVIP, "pod-a", "pod-b", "pod-c")

	f.requireRunning(t)
	waitUntil(t, time.Minute, "/healthz answers 200 after the outage", func() error {
		code, err := f.healthz()
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d", code)
		}
		return err
	})
}
