package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// The failure modes of docs/operations.md, each provoked against the real
// API server and kernel, asserting the metric, log line or command output
// the runbook names for it. One fixture: a small service map (so that
// filling it takes one Service), a short sync period (so that the drift
// repair comes within seconds) and the tc programs on the node's uplink
// (so that status has a device to show).
const (
	runbookSyncPeriod = 3 * time.Second
	runbookMapSize    = 64
	runbookDevice     = "eth0" // the node's uplink, harness.Options' default
)

// Log lines the runbook names.
const (
	logDrift   = "The dataplane drifted from what kpr wrote (or a call failed); running a complete reconcile to repair it"
	logMapFull = "Service port does not fit in the BPF maps: refused it alone"
	logSynced  = "Synced the dataplane"
	logAPIDown = "The API server does not answer kpr's list and watch calls"
	logAPIBack = "The API server answers kpr's calls again"
)

func TestRunbook(t *testing.T) {
	f := newFixture(t, "--sync-period", runbookSyncPeriod.String(),
		"--map-size-services", strconv.Itoa(runbookMapSize), "--devices", runbookDevice)
	if f.node.Uplink != runbookDevice {
		t.Fatalf("the node's uplink is %s, the test attaches to %s", f.node.Uplink, runbookDevice)
	}
	// The stuck watch comes last: it leaves kpr behind a proxy.
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, f *fixture, ns string)
	}{
		{"proxy-down", testRunbookProxyDown},
		{"dataplane-corrupted", testRunbookCorrupted},
		{"map-full", testRunbookMapFull},
		{"watch-stuck-and-lost-updates", testRunbookWatchStuck},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sc.run(t, f, f.namespace(t, sc.name))
			f.requireRunning(t)
		})
	}
}

// runbookStatus is the part of `kpr status -o json` these tests read.
type runbookStatus struct {
	Daemon *struct {
		Watcher struct {
			API struct {
				Connected         bool       `json:"connected"`
				DisconnectedSince *time.Time `json:"disconnectedSince"`
				LastError         string     `json:"lastError"`
				LastHeard         *time.Time `json:"lastHeard"`
			} `json:"api"`
		} `json:"watcher"`
	} `json:"daemon"`
	DaemonError string `json:"daemonError"`
	// Exit is kpr status's exit code.
	Exit  int `json:"-"`
	Links []struct {
		Type    string `json:"type"`
		Program string `json:"program"`
		Cgroup  string `json:"cgroup"`
		Device  string `json:"device"`
	} `json:"links"`
	Maps []struct {
		Map        string `json:"map"`
		Entries    int    `json:"entries"`
		MaxEntries int    `json:"maxEntries"`
	} `json:"maps"`
}

// statusArgs are kpr status's flags for the fixture's daemon, for
// kprStatus.
func (f *fixture) statusArgs(extra ...string) []string {
	return append([]string{"--metrics-address", f.kpr.MetricsAddr, "--host-netns", f.node.NetNS.Path}, extra...)
}

func (f *fixture) runbookStatus(t *testing.T) runbookStatus {
	t.Helper()
	out, code := f.kprStatus(t, f.statusArgs("-o", "json")...)
	var st runbookStatus
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("parse kpr status output: %v\n%s", err, out)
	}
	st.Exit = code
	return st
}

// The proxy is down: kpr status says so and still shows the pins (the
// cgroup and the device the programs are attached to, the map fill), and
// the pinned programs keep translating.
func testRunbookProxyDown(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a")

	if err := f.kpr.Stop(); err != nil {
		t.Fatal(err)
	}
	st := f.runbookStatus(t)
	if st.Daemon != nil || !strings.Contains(st.DaemonError, "no kpr daemon answers") || st.Exit != 3 {
		t.Errorf("with kpr stopped: daemon %+v, error %q, exit %d; want it reported not running, exit 3", st.Daemon, st.DaemonError, st.Exit)
	}
	cgroupLink := slices.ContainsFunc(st.Links, func(l struct {
		Type    string `json:"type"`
		Program string `json:"program"`
		Cgroup  string `json:"cgroup"`
		Device  string `json:"device"`
	}) bool {
		return l.Type == "CGroupInet4Connect" && l.Cgroup == f.cgroup.Path
	})
	var devices []string
	for _, l := range st.Links {
		if l.Device != "" {
			devices = append(devices, l.Type+" "+l.Device)
		}
	}
	slices.Sort(devices)
	if want := []string{"TCXEgress " + runbookDevice, "TCXIngress " + runbookDevice}; !cgroupLink || !slices.Equal(devices, want) {
		t.Errorf("links %+v: want connect4 on cgroup %s and the tc links %v", st.Links, f.cgroup.Path, want)
	}
	out, _ := f.kprStatus(t, f.statusArgs()...)
	table := string(out)
	for _, want := range []string{"daemon:   NOT RUNNING", "cgroup " + f.cgroup.Path, "device " + runbookDevice, "kpr_services"} {
		if !strings.Contains(table, want) {
			t.Errorf("kpr status lacks %q:\n%s", want, table)
		}
	}
	t.Logf("kpr status with the daemon stopped:\n%s", table)
	if _, err := f.healthz(); err == nil {
		t.Error("/healthz answers with kpr stopped")
	}
	requireServes(t, tcpWho, f.node.NetNS, vip, "pod-a")

	if err := f.kpr.Restart(); err != nil {
		t.Fatal(err)
	}
	f.waitHealthy()
}

// The dataplane is corrupted: an entry deleted by hand is named by kpr
// explain until the periodic drift check notices it, logs so and
// rewrites it.
func testRunbookCorrupted(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	f.explainSynced(t, vip.String(), func(r explainResult) error { return wantBackends(r, f, "pod-a", "pod-b") })

	logged := len(f.kpr.Log())
	deleteMasterEntry(t, f.kpr.BPFRoot, vip)
	r := f.explain(t, vip.String())
	if strings.Contains(f.kpr.Log()[logged:], logDrift) {
		t.Log("kpr repaired the entry before explain read the maps")
	} else if !slices.ContainsFunc(r.Divergences, func(d string) bool { return strings.Contains(d, "missing from the service map") }) {
		t.Errorf("divergences %q right after the entry was deleted: want it named missing", r.Divergences)
	}
	waitUntil(t, 3*runbookSyncPeriod, "kpr logs the drift", func() error {
		if !strings.Contains(f.kpr.Log()[logged:], logDrift) {
			return errNotYet
		}
		return nil
	})
	f.explainSynced(t, vip.String(), func(r explainResult) error { return wantBackends(r, f, "pod-a", "pod-b") })
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
}

// The rule count is high: the map fill shows in the metrics and in kpr
// status, and a Service that does not fit is refused alone, with a log
// line, a metric and a divergence in kpr explain.
func testRunbookMapFull(t *testing.T, f *fixture, ns string) {
	logged := len(f.kpr.Log())
	big := f.createService(t, kubeobj.Service(ns, "big", tcp80))
	f.setEndpoints(t, big, v4, unreachableEndpoints(runbookMapSize+1)...)
	f.waitMetric(t, `kpr_service_ports_refused{reason="MapFull"}`, "1")
	if !strings.Contains(f.kpr.Log()[logged:], logMapFull) || !strings.Contains(f.kpr.Log()[logged:], ns+"/big") {
		t.Errorf("kpr's log has no line %q naming %s/big:\n%s", logMapFull, ns, lastLines(f.kpr.Log(), 20))
	}
	max, errMax := f.kpr.Metric(`kpr_bpf_map_max_entries{map="kpr_services"}`)
	entries, errEntries := f.kpr.Metric(`kpr_bpf_map_entries{map="kpr_services"}`)
	n, _ := strconv.Atoi(entries)
	if errMax != nil || errEntries != nil || max != strconv.Itoa(runbookMapSize) || n <= 0 || n > runbookMapSize {
		t.Errorf("kpr_services fill %q of %q (%v, %v); want some entries of %d", entries, max, errEntries, errMax, runbookMapSize)
	}
	out, _ := f.kprStatus(t, f.statusArgs()...)
	table := string(out)
	if !strings.Contains(table, fmt.Sprintf("/ %d", runbookMapSize)) {
		t.Errorf("kpr status does not show the service map's capacity %d:\n%s", runbookMapSize, table)
	}
	if r := f.explain(t, ns+"/big"); len(r.Divergences) == 0 {
		t.Errorf("kpr explain of the refused Service names no divergence: %+v", r.Maps)
	}
	if code, err := f.healthz(); err != nil || code != 200 {
		t.Errorf("/healthz = %d, %v with one Service refused; want 200", code, err)
	}
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitMetric(t, `kpr_service_ports_refused{reason="MapFull"}`, "0")
}

// The watch is stuck: kpr reaches the API server through a proxy that
// stops relaying without closing anything. An EndpointSlice deleted
// meanwhile does not reach the dataplane, which keeps serving what it
// had; kpr status and kpr_api_connected say the API is not connected
// once client-go's HTTP/2 health check has given the connection up
// (shortened here from 30 s + 15 s) and the new watch waits. /healthz
// stays 200, as kube-proxy's does. Once the proxy relays again the watch
// resumes and the lost delete is applied.
func testRunbookWatchStuck(t *testing.T, f *fixture, ns string) {
	api, err := url.Parse(f.cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newPauseProxy(t, api.Host)
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "2")
	t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "2")
	if err := f.kpr.Stop(); err != nil {
		t.Fatal(err)
	}
	f.kpr.Args = append(f.kpr.Args, "--master", "https://"+proxy.Addr())
	if err := f.kpr.Restart(); err != nil {
		t.Fatal(err)
	}
	f.waitHealthy()

	svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	slice := f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")

	beforePause := len(f.kpr.Log())
	paused := time.Now()
	proxy.Pause()
	if err := f.client.DiscoveryV1().EndpointSlices(ns).Delete(f.ctx, slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "kpr status reports the API not connected", func() error {
		a := f.runbookStatus(t).Daemon.Watcher.API
		if a.Connected || a.DisconnectedSince == nil || a.LastHeard == nil {
			return fmt.Errorf("api %+v", a)
		}
		if a.LastHeard.After(paused) {
			return fmt.Errorf("last heard %s, after the proxy paused at %s", a.LastHeard, paused)
		}
		return nil
	})
	t.Logf("kpr status reported the API not connected %s after the pause", time.Since(paused).Round(time.Second))
	waitUntil(t, 2*time.Second, "kpr logs the outage", func() error {
		if !strings.Contains(f.kpr.Log()[beforePause:], logAPIDown) {
			return errNotYet
		}
		return nil
	})
	if !strings.Contains(f.kpr.Log()[beforePause:], "http2: client connection lost") {
		t.Errorf("no client-go line says the HTTP/2 health check gave the connection up:\n%s", lastLines(f.kpr.Log(), 20))
	}
	if v, err := f.kpr.Metric("kpr_api_connected"); err != nil || v != "0" {
		t.Errorf("kpr_api_connected = %q, %v; want 0", v, err)
	}
	if code, err := f.healthz(); err != nil || code != 200 {
		t.Errorf("/healthz = %d, %v with the watch stuck; want 200, as kube-proxy", code, err)
	}
	// The delete did not arrive: the dataplane serves what it had, and
	// kpr explain, which reads the API itself, names the difference.
	requireServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
	if r := f.explain(t, ns+"/web"); !slices.ContainsFunc(r.Divergences, func(d string) bool {
		return strings.Contains(d, "the maps hold backends") && strings.Contains(d, f.pod("pod-b").IPv4.String())
	}) {
		t.Errorf("kpr explain during the stuck watch: divergences %q, want the maps' stale backends named", r.Divergences)
	}
	out, code := f.kprStatus(t, f.statusArgs()...)
	table := string(out)
	if !strings.Contains(table, "api:      NOT CONNECTED since") || !strings.Contains(table, "last heard from") || code != 4 {
		t.Errorf("kpr status does not show the stuck connection, or exits %d, not 4 (unhealthy):\n%s", code, table)
	}
	t.Logf("kpr status with the watch stuck:\n%s", table)

	logged := len(f.kpr.Log())
	proxy.Resume()
	f.explainSynced(t, ns+"/web", func(r explainResult) error { return wantBackends(r, f) })
	waitUntil(t, convergeTimeout, "kpr status reports the API connected again", func() error {
		if a := f.runbookStatus(t).Daemon.Watcher.API; !a.Connected || !a.LastHeard.After(paused) {
			return fmt.Errorf("api %+v", a)
		}
		return nil
	})
	f.waitMetric(t, "kpr_api_connected", "1")
	// The log follows the state within a second.
	waitUntil(t, 2*time.Second, "kpr logs the end of the outage", func() error {
		if !strings.Contains(f.kpr.Log()[logged:], logAPIBack) {
			return errNotYet
		}
		return nil
	})
	synced := slices.ContainsFunc(strings.Split(f.kpr.Log()[logged:], "\n"), func(l string) bool {
		return strings.Contains(l, logSynced) && strings.Contains(l, ns+"/web")
	})
	if !synced {
		t.Errorf("no %q line names %s/web after the watch resumed:\n%s", logSynced, ns, lastLines(f.kpr.Log(), 20))
	}
}
