package socklb

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/harness"
)

// The three Services of the trace tests: one traced with a backend, one
// traced without endpoints, one not traced.
var (
	tracedVIP   = netip.AddrPortFrom(netip.MustParseAddr("10.96.7.1"), 80)
	emptyVIP    = netip.AddrPortFrom(netip.MustParseAddr("10.96.7.2"), 80)
	untracedVIP = netip.AddrPortFrom(netip.MustParseAddr("10.96.7.3"), 80)
)

func (f *fixture) traceServices() {
	f.t.Helper()
	f.service(tracedVIP.Addr(), tracedVIP.Port(), dataplane.TCP, f.pods[0])
	f.service(emptyVIP.Addr(), emptyVIP.Port(), dataplane.TCP)
	f.service(untracedVIP.Addr(), untracedVIP.Port(), dataplane.TCP, f.pods[0])
}

// kprTrace is a running `kpr trace -o json` and the events it printed.
type kprTrace struct {
	cmd    *exec.Cmd
	events chan maps.TraceEvent
}

func startKprTrace(t *testing.T, bpfRoot string, args ...string) *kprTrace {
	t.Helper()
	cmd := exec.Command(kprBinary(t), append([]string{"trace", "-o", "json", "--bpf-root", bpfRoot}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	// The selection is in place once kpr trace says so on stderr.
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "tracing ") {
		t.Fatalf("kpr trace did not start: %q, %v", line, err)
	}
	go io.Copy(io.Discard, stderr)
	tr := &kprTrace{cmd: cmd, events: make(chan maps.TraceEvent, 100)}
	go func() {
		defer close(tr.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev maps.TraceEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("kpr trace printed %q: %v", sc.Text(), err)
				return
			}
			tr.events <- ev
		}
	}()
	return tr
}

func (tr *kprTrace) next(t *testing.T) maps.TraceEvent {
	t.Helper()
	select {
	case ev, ok := <-tr.events:
		if !ok {
			t.Fatal("kpr trace ended its output")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no trace event within 5s")
	}
	panic("unreachable")
}

// stop interrupts kpr trace as Ctrl-C does and waits for it to exit.
func (tr *kprTrace) stop(t *testing.T) {
	t.Helper()
	if err := tr.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := tr.cmd.Wait(); err != nil {
		t.Fatalf("kpr trace after SIGINT: %v", err)
	}
}

// rejectErrno is how a connect to a frontend without endpoints fails:
// EPERM where the kernel lacks bpf_set_retval (before 5.18).
func (f *fixture) rejectErrno() syscall.Errno {
	if f.loaded.Features.Has(loader.FeatureSetRetval) {
		return syscall.ECONNREFUSED
	}
	return syscall.EPERM
}

func connectTCP(t *testing.T, f *fixture, to netip.AddrPort) error {
	t.Helper()
	_, err := harness.WhoTCP(f.node.NetNS, to, timeout)
	return err
}

func TestTraceShowsTracedFrontendsOnly(t *testing.T) {
	f := newFixture(t, 1, loader.MapSizes{})
	f.traceServices()
	tr := startKprTrace(t, f.bpfRoot, "--frontend", tracedVIP.String(), "--frontend", emptyVIP.String())

	if err := connectTCP(t, f, tracedVIP); err != nil {
		t.Fatal(err)
	}
	if err := connectTCP(t, f, emptyVIP); !errors.Is(err, f.rejectErrno()) {
		t.Fatalf("connect to a Service without endpoints: %v, want %v", err, f.rejectErrno())
	}
	if err := connectTCP(t, f, untracedVIP); err != nil {
		t.Fatal(err)
	}
	// A last traced connect: the ring keeps the programs' order, so once
	// it shows, anything about the untraced Service would have shown.
	if err := connectTCP(t, f, tracedVIP); err != nil {
		t.Fatal(err)
	}

	// Before 5.14 user space cannot read a namespace's cookie: then every
	// event must carry the first one's (all connects come from the node).
	nsCookie, err := loader.NetNSCookie(f.node.NetNS.Path)
	if errors.Is(err, unix.ENOPROTOOPT) {
		nsCookie = 0
	} else if err != nil {
		t.Fatal(err)
	}
	backend := netip.AddrPortFrom(f.pods[0].IPv4, tcpPort)
	want := []struct {
		frontend netip.AddrPort
		verdict  string
		backend  netip.AddrPort
	}{
		{tracedVIP, "translated", backend},
		{emptyVIP, "rejected", netip.AddrPort{}},
		{tracedVIP, "translated", backend},
	}
	for i, w := range want {
		ev := tr.next(t)
		if nsCookie == 0 && ev.NetNSCookie != 0 {
			nsCookie = ev.NetNSCookie
		}
		if ev.Frontend != w.frontend || ev.Verdict != w.verdict || ev.Backend != w.backend {
			t.Fatalf("event %d = %s %s -> %s, want %s %s -> %s (the untraced %s must not show)",
				i, ev.Frontend, ev.Verdict, ev.Backend, w.frontend, w.verdict, w.backend, untracedVIP)
		}
		if ev.Hook != "connect4" || ev.Proto != "TCP" || ev.SocketCookie == 0 || ev.NetNSCookie != nsCookie {
			t.Errorf("event %d: hook %s proto %s socket %d netns %d, want connect4 TCP, a socket cookie, netns %d",
				i, ev.Hook, ev.Proto, ev.SocketCookie, ev.NetNSCookie, nsCookie)
		}
		if loader.Probe().Has(loader.FeatureTaskHelpers) && (ev.PID != uint32(os.Getpid()) || ev.Comm == "") {
			t.Errorf("event %d: pid %d comm %q, want this test's pid %d and its comm", i, ev.PID, ev.Comm, os.Getpid())
		}
		if d := time.Since(ev.Time); d < 0 || d > time.Minute {
			t.Errorf("event %d: time %s is not about now", i, ev.Time)
		}
	}

	tr.stop(t)
	pinned, err := loader.OpenPinnedMaps(f.bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	assertNoTrace(t, pinned)
}

// assertNoTrace checks that no trace session is left in the maps.
func assertNoTrace(t *testing.T, m *bpf.KprMaps) {
	t.Helper()
	var on uint32
	if err := m.KprTraceOn.Lookup(uint32(0), &on); err != nil || on != 0 {
		t.Errorf("kpr_trace_on = %d, %v after the last trace ended; want 0", on, err)
	}
	var k bpf.KprTraceKey
	if err := m.KprTraceFrontends.NextKey(nil, &k); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("kpr_trace_frontends still holds %+v after the last trace ended (%v)", k, err)
	}
	var s uint32
	if err := m.KprTraceRings.NextKey(nil, &s); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("kpr_trace_rings still holds session %d after the last trace ended (%v)", s, err)
	}
}

// Two traces of the same frontend each see every event, and the first to
// end leaves the other's selection in place.
func TestTwoTracesKeepEachOthersSelection(t *testing.T) {
	f := newFixture(t, 1, loader.MapSizes{})
	f.traceServices()
	first, err := maps.StartTrace(f.loaded.Maps, []netip.AddrPort{tracedVIP})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := maps.StartTrace(f.loaded.Maps, []netip.AddrPort{tracedVIP})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if first.Session() == second.Session() {
		t.Fatalf("both traces hold session %d", first.Session())
	}

	if err := connectTCP(t, f, tracedVIP); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*maps.Trace{first, second} {
		if ev := readTrace(t, tr); ev.Frontend != tracedVIP || ev.Verdict != "translated" {
			t.Fatalf("session %d: %+v, want a translation of %s", tr.Session(), ev, tracedVIP)
		}
	}

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := connectTCP(t, f, tracedVIP); err != nil {
		t.Fatal(err)
	}
	if ev := readTrace(t, second); ev.Frontend != tracedVIP {
		t.Fatalf("after the first trace ended, the second saw %+v, want %s", ev, tracedVIP)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, f.loaded.Maps)
}

// A trace killed before it could remove its selection (SIGKILL) leaves
// its session behind; the next trace clears it, so that sessions do not
// run out and tracing switches off once that trace ends.
func TestKilledTraceIsClearedByTheNext(t *testing.T) {
	f := newFixture(t, 1, loader.MapSizes{})
	f.traceServices()
	killed := startKprTrace(t, f.bpfRoot, "--frontend", untracedVIP.String())
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	var k bpf.KprTraceKey
	if err := f.loaded.Maps.KprTraceFrontends.NextKey(nil, &k); err != nil {
		t.Fatalf("the killed trace left no selection to clear (%v): the test proves nothing", err)
	}

	tr, err := maps.StartTrace(f.loaded.Maps, []netip.AddrPort{tracedVIP})
	if err != nil {
		t.Fatal(err)
	}
	// Left: this trace's one entry, under its session and pid.
	var pid uint32
	entries := 0
	it := f.loaded.Maps.KprTraceFrontends.Iterate()
	for it.Next(&k, &pid) {
		entries++
		if uint32(k.Session) != tr.Session() || pid != uint32(os.Getpid()) {
			t.Errorf("selection entry of session %d, pid %d left after the next trace (session %d, pid %d) started",
				k.Session, pid, tr.Session(), os.Getpid())
		}
	}
	if entries != 1 {
		t.Errorf("%d selection entries after the next trace started, want its 1", entries)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, f.loaded.Maps)
}

func readTrace(t *testing.T, tr *maps.Trace) maps.TraceEvent {
	t.Helper()
	got := make(chan maps.TraceEvent, 1)
	errc := make(chan error, 1)
	go func() {
		ev, err := tr.Read()
		if err != nil {
			errc <- err
			return
		}
		got <- ev
	}()
	select {
	case ev := <-got:
		return ev
	case err := <-errc:
		t.Fatalf("read session %d: %v", tr.Session(), err)
	case <-time.After(5 * time.Second):
		t.Fatalf("session %d: no event within 5s", tr.Session())
	}
	panic("unreachable")
}

func TestSockCountersCountEachVerdict(t *testing.T) {
	f := newFixture(t, 1, loader.MapSizes{})
	f.traceServices()
	udpVIP := netip.AddrPortFrom(families[1].vip, 53)
	f.service(udpVIP.Addr(), udpVIP.Port(), dataplane.UDP, f.pods...)

	const translated, rejected, direct, udp = 5, 3, 4, 2
	for i := 0; i < translated; i++ {
		if err := connectTCP(t, f, untracedVIP); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < rejected; i++ {
		if err := connectTCP(t, f, emptyVIP); !errors.Is(err, f.rejectErrno()) {
			t.Fatalf("connect to a Service without endpoints: %v, want %v", err, f.rejectErrno())
		}
	}
	for i := 0; i < direct; i++ {
		if err := connectTCP(t, f, netip.AddrPortFrom(f.pods[0].IPv4, tcpPort)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < udp; i++ {
		if _, from, err := harness.WhoUDP(f.node.NetNS, udpVIP, timeout); err != nil || from != udpVIP {
			t.Fatalf("UDP to %s: reply from %s, %v", udpVIP, from, err)
		}
	}

	stats, err := maps.SockStats(f.loaded.Maps.KprSockStats)
	if err != nil {
		t.Fatal(err)
	}
	byHook := map[string]maps.SockHookStats{}
	for _, s := range stats {
		byHook[s.Hook] = s
	}
	// Only this test's process is in the cgroup, and its connects are the
	// ones above: translations and rejects are exact. Passes are at
	// least the direct connects (the harness may connect elsewhere too).
	c4 := byHook["connect4"]
	if c4.Translated != translated || c4.Rejected != rejected || c4.Passed < direct {
		t.Errorf("connect4 = %+v, want %d translated, %d rejected, at least %d passed", c4, translated, rejected, direct)
	}
	if s := byHook["sendmsg6"]; s.Translated != udp {
		t.Errorf("sendmsg6 = %+v, want %d translated", s, udp)
	}
	if s := byHook["recvmsg6"]; s.Translated != udp {
		t.Errorf("recvmsg6 = %+v, want %d translated (replies shown from the VIP)", s, udp)
	}

	// The metric reads the same map at scrape time, as kpr run registers it.
	m := metrics.New()
	m.Registry.MustRegister(metrics.NewSockStatsCollector(ebpfplane.SockCounts(f.loaded.Maps.KprSockStats)))
	rec := httptest.NewRecorder()
	m.Handler("ebpf").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics answered %d", rec.Code)
	}
	for _, series := range []string{
		fmt.Sprintf(`kpr_sock_translations_total{hook="connect4"} %d`, translated),
		fmt.Sprintf(`kpr_sock_rejects_total{hook="connect4"} %d`, rejected),
		fmt.Sprintf(`kpr_sock_translations_total{hook="sendmsg6"} %d`, udp),
	} {
		if !strings.Contains(rec.Body.String(), series+"\n") {
			t.Errorf("scrape lacks %q", series)
		}
	}

	// kpr status shows them too, from the pin.
	out := statusWithoutDaemon(t, "-o", "json", "--bpf-root", f.bpfRoot)
	var st struct {
		SockCounters []maps.SockHookStats `json:"sockCounters"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range st.SockCounters {
		if s.Hook == "connect4" {
			found = true
			if s.Translated != translated || s.Rejected != rejected {
				t.Errorf("kpr status connect4 = %+v, want %d translated, %d rejected", s, translated, rejected)
			}
		}
	}
	if !found {
		t.Errorf("kpr status -o json has no connect4 counters: %s", out)
	}
	out = statusWithoutDaemon(t, "--bpf-root", f.bpfRoot)
	if !strings.Contains(string(out), "socket hook counters") || !strings.Contains(string(out), "connect4") {
		t.Errorf("kpr status lacks the counters section:\n%s", out)
	}
}

// statusWithoutDaemon runs kpr status with args where no daemon answers,
// which it ends with 3 (not running) after showing what the pins say, and
// returns what it showed.
func statusWithoutDaemon(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(kprBinary(t), append([]string{"status", "--metrics-address", "127.0.0.1:1"}, args...)...).Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("kpr status %s with no daemon: %v, want exit 3 (not running)\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// BenchmarkConnectTrace is BenchmarkConnect's measurement (one Service)
// with the trace machinery in each state: "off", no trace running, the
// state every node is in but while someone debugs, whose cost must be that
// of the tree before tracing existed (compare BenchmarkConnect/services=1
// there); "other", a trace of another frontend, so every connect checks the
// selection; "traced", a trace of this frontend, drained as it runs.
//
//	go test ./tests/socklb -run '^$' -bench ConnectTrace -benchtime 5000x
func BenchmarkConnectTrace(b *testing.B) {
	f := newFixture(b, 1, loader.MapSizes{})
	backend := netip.AddrPortFrom(f.pods[0].IPv4, tcpPort)
	f.service(tracedVIP.Addr(), tracedVIP.Port(), dataplane.TCP, f.pods[0])

	b.Run("off", func(b *testing.B) { benchConnect(b, f, tracedVIP, backend) })
	b.Run("other", func(b *testing.B) {
		tr, err := maps.StartTrace(f.loaded.Maps, []netip.AddrPort{untracedVIP})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Close()
		benchConnect(b, f, tracedVIP, backend)
	})
	b.Run("traced", func(b *testing.B) {
		tr, err := maps.StartTrace(f.loaded.Maps, []netip.AddrPort{tracedVIP})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				if _, err := tr.Read(); err != nil {
					return
				}
			}
		}()
		defer tr.Close()
		benchConnect(b, f, tracedVIP, backend)
	})
}
