package tcnat

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// Requests per second and latency through a NodePort, kpr's tc programs
// against kube-proxy-style iptables rules, in the same run. Each side has
// a namespace topology of its own (topology_test.go, built by the same
// fixture: client, node, two backend pods), so each node namespace looks
// like a node running that dataplane alone:
//
//   - kpr: its tc programs on the node's device and the Services in its
//     maps (through ebpfplane). The namespace never had an iptables rule,
//     so no netfilter table, NAT or conntrack hook is registered in it,
//     as on a node where kpr replaces kube-proxy; every round checks that
//     netfilter's conntrack table there stays empty.
//   - iptables-legacy, iptables-nft: no kpr, and the same Services as
//     kube-proxy would write them, rendered from the same desired state by
//     kpr's own iptables renderer (iptables-compat) and applied with
//     iptables-restore inside that node namespace only.
//
// Rounds alternate, each pass over the sides in the reverse order of the
// one before (kpr, legacy, nft, then nft, legacy, kpr), so that a load
// change on the shared machine hits every side alike. docs/tc-dataplane.md
// (Benchmark) has the results and how to read them.
//
//	go test ./tests/tcnat -run '^$' -bench NodePortRequests -benchtime 1x
var (
	benchServices = flag.Int("tcbench.services", 1000, "Services present in every dataplane during BenchmarkNodePortRequests")
	benchRounds   = flag.Int("tcbench.rounds", 6, "rounds of each side in BenchmarkNodePortRequests")
	benchRound    = flag.Duration("tcbench.round", 3*time.Second, "length of one measured round")
	benchClients  = flag.Int("tcbench.clients", 8, "concurrent clients, each one request at a time")
	benchIPTables = flag.String("tcbench.iptables", "legacy,nft", "iptables variants to measure, comma separated: legacy, nft")
)

const (
	sideKpr    = "kpr"
	benchPods  = 2
	benchFirst = 30000 // NodePort of the first dressed Service
)

// alternateRounds measures *benchRounds rounds of every side, each pass
// over the sides in the reverse order of the one before, so that a load
// change on the shared machine hits every side alike, and returns each
// side's rounds by name.
func alternateRounds[S any](sides []S, name func(S) string, round func(S) roundResult) map[string][]roundResult {
	results := map[string][]roundResult{}
	for i := 0; i < *benchRounds; i++ {
		order := sides
		if i%2 == 1 {
			order = slices.Clone(sides)
			slices.Reverse(order)
		}
		for _, s := range order {
			res := round(s)
			// Progress on stdout: a benchmark's log keeps only 10 lines,
			// which the summary needs.
			fmt.Printf("round %d %-16s %s  (%d requests, %d failed%s)\n", i+1, name(s), res, len(res.latencies), res.failed, firstFailure(res))
			results[name(s)] = append(results[name(s)], res)
		}
	}
	return results
}

// requestLine is what a client sends; the echo server answers with its
// greeting and the line.
var requestLine = []byte("ping\n")

func BenchmarkNodePortRequests(b *testing.B) {
	variants, err := parseVariants(*benchIPTables)
	if err != nil {
		b.Fatal(err)
	}
	r := newBenchRig(b, *benchServices, variants)
	b.Logf("%d Services in each dataplane; target %s (its rule is %d of %d in KUBE-NODEPORTS); %d clients, %d rounds of %s per side",
		*benchServices, r.fe, *benchServices/2+1, *benchServices, *benchClients, *benchRounds, *benchRound)
	// The first requests of a run are slower (threads, neighbour
	// entries, caches): one short round of each side is not counted.
	for _, s := range r.sides {
		r.round(b, s, *benchRound/3, *benchClients)
	}
	results := alternateRounds(r.sides, func(s *benchSide) string { return s.name }, func(s *benchSide) roundResult {
		return r.round(b, s, *benchRound, *benchClients)
	})
	kpr := pool(results[sideKpr])
	b.ReportMetric(kpr.rate(), "kpr-req/s")
	b.ReportMetric(us(kpr.quantile(0.50)), "kpr-p50-µs")
	b.ReportMetric(us(kpr.quantile(0.99)), "kpr-p99-µs")
	b.ReportMetric(us(kpr.cpuPerRequest()), "kpr-cpu-µs/req")
	for _, s := range r.sides {
		b.Logf("all rounds: %-16s %s", s.name, pool(results[s.name]))
	}
	for _, s := range r.sides[1:] {
		ipt := pool(results[s.name])
		var ratios []float64
		for i := range results[s.name] {
			ratios = append(ratios, results[sideKpr][i].rate()/results[s.name][i].rate())
		}
		slices.Sort(ratios)
		b.Logf("kpr / %s request rate: %.2fx overall, per round pair (sorted) %s; CPU per request %.2fx less",
			s.name, kpr.rate()/ipt.rate(), formatRatios(ratios), float64(ipt.cpuPerRequest())/float64(kpr.cpuPerRequest()))
		b.ReportMetric(ipt.rate(), s.name+"-req/s")
		b.ReportMetric(us(ipt.quantile(0.50)), s.name+"-p50-µs")
		b.ReportMetric(us(ipt.quantile(0.99)), s.name+"-p99-µs")
		b.ReportMetric(us(ipt.cpuPerRequest()), s.name+"-cpu-µs/req")
		b.ReportMetric(kpr.rate()/ipt.rate(), "kpr/"+s.name)
	}
}

// One short round of each side, on a few Services: every side serves, each
// from its own node namespace, and kpr's without netfilter conntrack.
func TestNodePortBenchRigServesBothSides(t *testing.T) {
	r := newBenchRig(t, 10, []netfilter.Variant{netfilter.Legacy})
	for _, s := range []*benchSide{r.sides[0], r.sides[1], r.sides[0]} {
		res := r.round(t, s, 200*time.Millisecond, 2)
		t.Logf("%-16s %s", s.name, res)
		// A SYN lost on a busy machine fails a request now and then.
		if len(res.latencies) == 0 || res.failed*10 > len(res.latencies) {
			t.Errorf("%s: %d requests served, %d failed%s", s.name, len(res.latencies), res.failed, firstFailure(res))
		}
	}
}

// The rounds' flush of an iptables side's conntrack table empties the
// table of that side's node namespace (and so leaves the host's alone).
func TestNodePortBenchFlushesTheNodesConntrack(t *testing.T) {
	r := newBenchRig(t, 10, []netfilter.Variant{netfilter.Legacy})
	s := r.sides[1]
	load(s.top.client.NetNS, r.fe, 1, 100*time.Millisecond)
	node := s.top.node.NetNS
	if n := nfConntrackCount(t, node); n == 0 {
		t.Fatalf("no connection tracked in %s after requests through its iptables rules", node.Name)
	}
	if err := netfilterNetlink(t, node).ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		t.Fatal(err)
	}
	if n := nfConntrackCount(t, node); n != 0 {
		t.Errorf("%d connections tracked in %s after the flush", n, node.Name)
	}
}

// benchRig is one topology per side, each serving the same Services.
type benchRig struct {
	sides []*benchSide // kpr first
	fe    netip.AddrPort
}

// benchSide is one dataplane and the topology it alone serves.
type benchSide struct {
	name    string
	top     *topology
	variant netfilter.Variant // of an iptables side
	run     netfilter.Runner  // in the node namespace, for an iptables side
}

func (s *benchSide) kpr() bool { return s.name == sideKpr }

func newBenchRig(tb testing.TB, services int, variants []netfilter.Variant) *benchRig {
	tb.Helper()
	// kpr's maps at the sizes it ships with. The fixture's 4,096-entry
	// conntrack map fills within a round, and a full one stalls some new
	// connections for a SYN retransmit or more (docs/tc-dataplane.md,
	// Benchmark), which would measure that instead.
	top := newTopologySized(tb, benchPods, loader.TCAttachAuto, loader.MapSizes{})
	backends := top.backends(nodeAddr(false), dataplane.TCP, top.pods...)
	all, fe := dressedServices(services, nodeAddr(false), backends)
	r := &benchRig{fe: fe, sides: []*benchSide{{name: sideKpr, top: top}}}
	start := time.Now()
	if err := ebpfplane.New(top.lb, zap.NewNop()).Reconcile(all); err != nil {
		tb.Fatalf("program %d Services into kpr's maps: %v", services, err)
	}
	tb.Logf("kpr: %d Services written in %s", services, time.Since(start).Round(time.Millisecond))
	for _, v := range variants {
		top := buildTopology(tb, benchPods)
		s := &benchSide{name: "iptables-" + string(v), top: top, variant: v,
			run: netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", top.node.NetNS.Name}}}
		// The same pod addresses in every topology: the same desired
		// state serves them all.
		if got := top.backends(fe.Addr(), dataplane.TCP, top.pods...); !slices.Equal(got, backends) {
			tb.Fatalf("%s: the topology's pods are %v, kpr's %v", s.name, got, backends)
		}
		p, err := iptables.New(iptables.Options{Runner: s.run, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4)}})
		if err != nil {
			tb.Fatal(err)
		}
		start := time.Now()
		if err := p.Reconcile(all); err != nil {
			tb.Fatalf("program %d Services with iptables-%s in %s: %v", services, v, top.node.NetNS.Name, err)
		}
		tb.Logf("iptables-%s: %d Services written in %s", v, services, time.Since(start).Round(time.Millisecond))
		r.sides = append(r.sides, s)
	}
	for _, s := range r.sides {
		setClientSysctls(tb, s.top.client.NetNS)
	}
	return r
}

// dressedServices are n NodePort Services, each with a ClusterIP and a
// NodePort on node, all served by backends; the one in the middle of the
// name order (and so of kube-proxy's KUBE-NODEPORTS chain) is the target.
func dressedServices(n int, node netip.Addr, backends []netip.AddrPort) (map[dataplane.ServicePortName]*dataplane.ServicePort, netip.AddrPort) {
	var bes []dataplane.Backend
	for _, b := range backends {
		bes = append(bes, dataplane.Backend{Addr: b.Addr(), Port: b.Port()})
	}
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for i := 0; i < n; i++ {
		name := dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", i), Protocol: dataplane.TCP}
		cip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		all[name] = &dataplane.ServicePort{Name: name, Frontends: []dataplane.Frontend{
			{Addr: cip, Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP, Backends: bes},
			{Addr: node, Port: uint16(benchFirst + i), Protocol: dataplane.TCP, Kind: dataplane.NodePort, Backends: bes},
		}}
	}
	return all, netip.AddrPortFrom(node, uint16(benchFirst+n/2))
}

// setClientSysctls lets one client namespace open thousands of short
// connections a second: the whole port range, and reuse of ports whose
// closed connections wait in TIME_WAIT (the client closes first).
func setClientSysctls(tb testing.TB, ns *harness.NetNS) {
	tb.Helper()
	err := harness.Do(ns, func() error {
		for k, v := range map[string]string{"net/ipv4/ip_local_port_range": "1024 65535", "net/ipv4/tcp_tw_reuse": "1"} {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("sysctls of the client namespace: %v", err)
	}
}

// roundResult is one round's requests.
type roundResult struct {
	latencies []time.Duration // of the requests that completed, sorted
	elapsed   time.Duration
	// cpu is the test process's CPU time over the round. Client, node
	// and pods all run in it, and the packets' softirq work is mostly
	// charged to the thread that sent them, so per request it is the
	// cost of one request end to end, and less sensitive than the rate
	// to what else the machine runs.
	cpu      time.Duration
	failed   int
	firstErr error
}

func (r roundResult) String() string {
	slow, stalled := r.slow()
	return fmt.Sprintf("%6.0f req/s  p50 %5.0f µs  p99 %6.0f µs  CPU %4.0f µs/request  %d over %s (%.1f s)",
		r.rate(), us(r.quantile(0.50)), us(r.quantile(0.99)), us(r.cpuPerRequest()), slow, slowRequest, stalled.Seconds())
}

// slowRequest is a latency that takes more than scheduling delays: a
// lost SYN, retransmitted after 1 s, or a stall of that order.
const slowRequest = 200 * time.Millisecond

// slow counts the requests that took slowRequest or more, and their time.
// A client waits that time instead of sending requests, so a few such
// requests lower the rate more than the percentiles show.
func (r roundResult) slow() (int, time.Duration) {
	var n int
	var d time.Duration
	for _, l := range r.latencies {
		if l >= slowRequest {
			n++
			d += l
		}
	}
	return n, d
}

func (r roundResult) rate() float64 { return float64(len(r.latencies)) / r.elapsed.Seconds() }

func (r roundResult) cpuPerRequest() time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	return r.cpu / time.Duration(len(r.latencies))
}

func (r roundResult) quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	return r.latencies[int(q*float64(len(r.latencies)-1))]
}

// pool merges rounds of one side.
func pool(rs []roundResult) roundResult {
	var out roundResult
	for _, r := range rs {
		out.latencies = append(out.latencies, r.latencies...)
		out.elapsed += r.elapsed
		out.cpu += r.cpu
		out.failed += r.failed
	}
	slices.Sort(out.latencies)
	return out
}

func firstFailure(r roundResult) string {
	if r.firstErr == nil {
		return ""
	}
	return ", the first: " + r.firstErr.Error()
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func formatRatios(rs []float64) string {
	var s []string
	for _, r := range rs {
		s = append(s, strconv.FormatFloat(r, 'f', 2, 64))
	}
	return strings.Join(s, " ")
}

// round measures side for d, after both conntrack tables are emptied and a
// short warm-up, and fails unless side served every request: kpr's
// counter of new flows, or the packet counter of the target's
// KUBE-NODEPORTS rule, grows by at least the requests served, and kpr's
// does not grow while iptables is measured.

// round measures side for d, after its conntrack table is emptied and a
// short warm-up, and fails unless side served every request: kpr's
// counter of new flows, or the packet counter of the target's
// KUBE-NODEPORTS rule, grows by at least the requests served. It also
// fails if netfilter tracked a connection in kpr's node namespace, and,
// so that this check is known to see what it looks for, if it tracked
// none in an iptables side's.
func (r *benchRig) round(tb testing.TB, s *benchSide, d time.Duration, clients int) roundResult {
	tb.Helper()
	node := s.top.node.NetNS
	if s.kpr() {
		s.top.flushConntrack()
		if n := nfConntrackCount(tb, node); n != 0 {
			tb.Fatalf("kpr round: netfilter tracks %d connections in kpr's node namespace %s before it", n, node.Name)
		}
	} else if err := netfilterNetlink(tb, node).ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		tb.Fatalf("flush the conntrack table of %s (%s): %v", node.Name, s.name, err)
	}
	load(s.top.client.NetNS, r.fe, clients, d/10)
	var kprBefore bpf.KprNatStats
	if s.kpr() {
		kprBefore = s.top.stats()
	}
	iptBefore := s.nodePortPackets(tb, r.fe.Port())
	cpu0 := processCPU(tb)
	res := load(s.top.client.NetNS, r.fe, clients, d)
	res.cpu = processCPU(tb) - cpu0
	n := uint64(len(res.latencies))
	tracked := nfConntrackCount(tb, node)
	if !s.kpr() {
		if got := s.nodePortPackets(tb, r.fe.Port()) - iptBefore; got < n {
			tb.Fatalf("%s round: %d requests served but the NodePort rule counted %d packets", s.name, n, got)
		}
		if tracked == 0 {
			tb.Fatalf("%s round: netfilter's conntrack table in %s is empty after %d requests: the check of kpr's rounds sees nothing", s.name, node.Name, n)
		}
		return res
	}
	kprAfter := s.top.stats()
	if res.failed > 0 {
		// Say whether kpr's programs dropped what failed.
		res.firstErr = fmt.Errorf("%w (kpr's drops in the round: conntrack insert %d, rewrite %d, no backend %d)", res.firstErr,
			kprAfter.DropCtInsert-kprBefore.DropCtInsert, kprAfter.DropRewrite-kprBefore.DropRewrite, kprAfter.DropNoBackend-kprBefore.DropNoBackend)
	}
	if flows := kprAfter.NewFlows - kprBefore.NewFlows; flows < n {
		tb.Fatalf("kpr round: %d requests served but kpr's programs saw %d new flows", n, flows)
	}
	if tracked != 0 {
		tb.Fatalf("kpr round: netfilter tracked %d connections in kpr's node namespace %s: its hooks run there", tracked, node.Name)
	}
	return res
}

// netfilterNetlink is a netlink handle for netfilter's conntrack in ns. The
// harness's handle (NetNS.Netlink) has only a NETLINK_ROUTE socket, and the
// netlink library sends a request of another protocol through a socket of
// the calling thread's namespace: a conntrack flush through it would flush
// the host's table.
func netfilterNetlink(tb testing.TB, ns *harness.NetNS) *netlink.Handle {
	tb.Helper()
	h, err := netlink.NewHandleAt(ns.Handle(), unix.NETLINK_NETFILTER)
	if err != nil {
		tb.Fatalf("netlink netfilter socket in %s: %v", ns.Name, err)
	}
	tb.Cleanup(h.Close)
	return h
}

// nfConntrackCount is the number of connections in netfilter's conntrack
// table of ns.
func nfConntrackCount(tb testing.TB, ns *harness.NetNS) uint64 {
	tb.Helper()
	var n uint64
	err := harness.Do(ns, func() error {
		// The sysctl is per namespace; it is missing only while
		// nf_conntrack is not loaded at all, when nothing is tracked.
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		n, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return err
	})
	if err != nil {
		tb.Fatalf("netfilter's conntrack count in %s: %v", ns.Name, err)
	}
	return n
}

// processCPU is the user and system time of the test process so far.
func processCPU(tb testing.TB) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nodePortPackets is the packet counter of the target's KUBE-NODEPORTS

// nodePortPackets is the packet counter of port's KUBE-NODEPORTS rule in
// the tables of an iptables side (0 for kpr).
func (s *benchSide) nodePortPackets(tb testing.TB, port uint16) uint64 {
	tb.Helper()
	if s.kpr() {
		return 0
	}
	out, err := s.run.Run(netfilter.ToolsFor(s.variant, netfilter.IPv4).Save, []string{"-c", "-t", "nat"}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		// [packets:bytes] -A KUBE-NODEPORTS ... --dport N ...
		counters, rule, ok := strings.Cut(l, " ")
		if !ok || !strings.HasPrefix(rule, "-A KUBE-NODEPORTS ") || !strings.Contains(rule+" ", fmt.Sprintf(" --dport %d ", port)) {
			continue
		}
		pkts, _, _ := strings.Cut(strings.Trim(counters, "[]"), ":")
		n, err := strconv.ParseUint(pkts, 10, 64)
		if err != nil {
			tb.Fatalf("counters of %q: %v", l, err)
		}
		return n
	}
	tb.Fatalf("no KUBE-NODEPORTS rule for port %d in %s-save", port, s.name)
	return 0
}

// load runs clients loops of requests to fe from ns for d and returns the
// requests that started within d; elapsed runs until the last one ended.
func load(ns *harness.NetNS, fe netip.AddrPort, clients int, d time.Duration) roundResult {
	var (
		mu  sync.Mutex
		res roundResult
		wg  sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			failed, first := 0, error(nil)
			// One thread in the client namespace for the whole loop:
			// its sockets are created there without a namespace switch
			// per request.
			err := harness.Do(ns, func() error {
				buf := make([]byte, 256)
				for time.Now().Before(end) {
					t0 := time.Now()
					if err := request(fe, buf, 2*time.Second); err != nil {
						failed++
						if first == nil {
							first = err
						}
						continue
					}
					lat = append(lat, time.Since(t0))
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			res.latencies = append(res.latencies, lat...)
			res.failed += failed
			if res.firstErr == nil {
				res.firstErr = errors.Join(first, err)
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	slices.Sort(res.latencies)
	return res
}

// request is one short TCP request: connect to fe, send requestLine, read
// the server's greeting and the line echoed back, close (FIN first from
// the client, as an HTTP/1.0 client would). It runs syscalls directly on
// the calling thread, which must be in the client's namespace; Go's
// poller is not involved.
func request(fe netip.AddrPort, buf []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: fe.Addr().As4(), Port: int(fe.Port())})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return fmt.Errorf("connect %s: %w", fe, err)
	}
	if err := waitFD(fd, unix.POLLOUT, deadline); err != nil {
		return fmt.Errorf("connect %s: %w", fe, err)
	}
	if e, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
		return fmt.Errorf("connect %s: %w", fe, errors.Join(err, unix.Errno(e)))
	}
	// Five bytes on a new connection always fit the send buffer.
	if _, err := unix.Write(fd, requestLine); err != nil {
		return fmt.Errorf("send to %s: %w", fe, err)
	}
	got := 0
	for {
		if err := waitFD(fd, unix.POLLIN, deadline); err != nil {
			return fmt.Errorf("read from %s after %q: %w", fe, buf[:got], err)
		}
		n, err := unix.Read(fd, buf[got:])
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read from %s: %w", fe, err)
		}
		if n == 0 {
			return fmt.Errorf("%s closed the connection after %q", fe, buf[:got])
		}
		got += n
		// "<pod>\n" then the request echoed.
		if i := bytes.IndexByte(buf[:got], '\n'); i >= 0 && got-i-1 >= len(requestLine) {
			if !bytes.Equal(buf[i+1:got], requestLine) {
				return fmt.Errorf("%s answered %q", fe, buf[:got])
			}
			return nil
		}
		if got == len(buf) {
			return fmt.Errorf("%s sent %q: not the echo server", fe, buf[:got])
		}
	}
}

// waitFD polls fd for events until deadline; a signal (Go preempts with
// SIGURG) just polls again.
func waitFD(fd int, events int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: events}}, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			continue
		}
		return err
	}
}

// slowerThan counts the completed requests that took at least d.
func (r roundResult) slowerThan(d time.Duration) int {
	i, _ := slices.BinarySearch(r.latencies, d)
	return len(r.latencies) - i
}
