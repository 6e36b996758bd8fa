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

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/tests/harness"
)

// Requests per second and latency through a NodePort, kpr's tc programs
// against kube-proxy-style iptables rules, in the same namespace topology
// (topology_test.go) and the same run. Both dataplanes hold the same
// Services the whole time, fed the same desired state: kpr's maps through
// ebpfplane, the node namespace's tables through kpr's own iptables
// renderer (iptables-compat), applied with iptables-restore inside that
// namespace only. A round measures one side with the other bypassed at the
// head of its hooks, one cheap rule or program per packet, so the rules and
// maps never change between rounds:
//
//   - kpr measured: an ACCEPT first in each built-in chain the iptables
//     rules hang off, so no packet reaches kube-proxy's chains;
//   - iptables measured: a two-instruction tc program first on the tcx
//     chains of the node's device, returning TC_ACT_OK, so kpr's programs
//     never run.
//
// Rounds alternate, each pass over the sides in the reverse order of the
// one before (kpr, legacy, nft, then nft, legacy, kpr), so that a load
// change on the shared machine hits every side alike. docs/tc-dataplane.md
// (Benchmark) has the results and how to read them.
//
//	go test ./tests/tcnat -run '^$' -bench NodePortRequests -benchtime 1x
var (
	benchServices = flag.Int("tcbench.services", 1000, "Services present in both dataplanes during BenchmarkNodePortRequests")
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

// requestLine is what a client sends; the echo server answers with its
// greeting and the line.
var requestLine = []byte("ping\n")

func BenchmarkNodePortRequests(b *testing.B) {
	var variants []iptables.Variant
	for _, v := range strings.Split(*benchIPTables, ",") {
		switch iptables.Variant(v) {
		case iptables.Legacy, iptables.NFT:
			variants = append(variants, iptables.Variant(v))
		default:
			b.Fatalf("-tcbench.iptables=%q: want legacy, nft or both, comma separated", *benchIPTables)
		}
	}
	r := newBenchRig(b, *benchServices, variants)
	b.Logf("%d Services in both dataplanes; target %s (its rule is %d of %d in KUBE-NODEPORTS); %d clients, %d rounds of %s per side",
		*benchServices, r.fe, *benchServices/2+1, *benchServices, *benchClients, *benchRounds, *benchRound)
	sides := []string{sideKpr}
	for _, v := range variants {
		sides = append(sides, iptablesSide(v))
	}
	// The first requests of a run are slower (threads, neighbour
	// entries, caches): one short round of each side is not counted.
	for _, s := range sides {
		r.round(b, s, *benchRound/3, *benchClients)
	}
	results := map[string][]roundResult{}
	for i := 0; i < *benchRounds; i++ {
		order := sides
		if i%2 == 1 {
			order = slices.Clone(sides)
			slices.Reverse(order)
		}
		for _, s := range order {
			res := r.round(b, s, *benchRound, *benchClients)
			// Progress on stdout: a benchmark's log keeps only 10 lines,
			// which the summary below needs.
			fmt.Printf("round %d %-16s %s  (%d requests, %d failed%s)\n", i+1, s, res, len(res.latencies), res.failed, firstFailure(res))
			results[s] = append(results[s], res)
		}
	}
	kpr := pool(results[sideKpr])
	b.ReportMetric(kpr.rate(), "kpr-req/s")
	b.ReportMetric(us(kpr.quantile(0.99)), "kpr-p99-µs")
	b.ReportMetric(us(kpr.cpuPerRequest()), "kpr-cpu-µs/req")
	for _, s := range sides {
		b.Logf("all rounds: %-16s %s", s, pool(results[s]))
	}
	for _, s := range sides[1:] {
		ipt := pool(results[s])
		var ratios []float64
		for i := range results[s] {
			ratios = append(ratios, results[sideKpr][i].rate()/results[s][i].rate())
		}
		slices.Sort(ratios)
		b.Logf("kpr / %s request rate: %.2fx overall, per round pair (sorted) %s; CPU per request %.2fx less",
			s, kpr.rate()/ipt.rate(), formatRatios(ratios), float64(ipt.cpuPerRequest())/float64(kpr.cpuPerRequest()))
		b.ReportMetric(ipt.rate(), s+"-req/s")
		b.ReportMetric(us(ipt.quantile(0.99)), s+"-p99-µs")
		b.ReportMetric(us(ipt.cpuPerRequest()), s+"-cpu-µs/req")
		b.ReportMetric(kpr.rate()/ipt.rate(), "kpr/"+s)
	}
}

// One short round of each side, on a few Services: the rig serves from
// both dataplanes, and each round is served by the side it measures.
func TestNodePortBenchRigServesBothSides(t *testing.T) {
	r := newBenchRig(t, 10, []iptables.Variant{iptables.Legacy})
	for _, s := range []string{sideKpr, iptablesSide(iptables.Legacy), sideKpr} {
		res := r.round(t, s, 200*time.Millisecond, 2)
		t.Logf("%-16s %s", s, res)
		// A SYN lost on a busy machine fails a request now and then.
		if len(res.latencies) == 0 || res.failed*10 > len(res.latencies) {
			t.Errorf("%s: %d requests served, %d failed%s", s, len(res.latencies), res.failed, firstFailure(res))
		}
	}
}

func iptablesSide(v iptables.Variant) string { return "iptables-" + string(v) }

// benchRig is the topology with both dataplanes programmed, and the
// bypasses that pick the side that serves.
type benchRig struct {
	top      *topology
	fe       netip.AddrPort // the NodePort the clients ask
	run      iptables.Runner
	variants []iptables.Variant
	tcPass   []link.Link // attached while iptables is measured
	pass     *ebpf.Program
	served   map[string]bool // per iptables variant: its rules are reachable (not bypassed)
}

func newBenchRig(tb testing.TB, services int, variants []iptables.Variant) *benchRig {
	tb.Helper()
	// kpr's maps at the sizes it ships with. The fixture's 4,096-entry
	// conntrack map fills within a round, and a full one stalls some new
	// connections for a SYN retransmit or more (docs/tc-dataplane.md,
	// Benchmark), which would measure that instead.
	top := buildTopology(tb, benchPods)
	loaded := loadDataplaneSized(tb, newBPFRoot(tb),
		&loader.TCOptions{Devices: []string{extDev}, Mode: loader.TCAttachTCX, NetNS: top.node.NetNS.Path}, loader.MapSizes{})
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		tb.Fatal(err)
	}
	top.progs = &progs{t: tb, loaded: loaded, lb: lb, ingress: loaded.TC.Ingress, egress: loaded.TC.Egress}
	r := &benchRig{top: top, variants: variants, served: map[string]bool{},
		run: iptables.ExecRunner{Prefix: []string{"ip", "netns", "exec", top.node.NetNS.Name}}}
	all, fe := dressedServices(services, nodeAddr(false), top.backends(nodeAddr(false), dataplane.TCP, top.pods...))
	r.fe = fe
	start := time.Now()
	if err := ebpfplane.New(top.lb, zap.NewNop()).Reconcile(all); err != nil {
		tb.Fatalf("program %d Services into kpr's maps: %v", services, err)
	}
	tb.Logf("kpr: %d Services written in %s", services, time.Since(start).Round(time.Millisecond))
	for _, v := range variants {
		p, err := iptables.New(iptables.Options{Runner: r.run, Families: map[iptables.Family]iptables.Tools{iptables.IPv4: iptables.ToolsFor(v, iptables.IPv4)}})
		if err != nil {
			tb.Fatal(err)
		}
		start := time.Now()
		if err := p.Reconcile(all); err != nil {
			tb.Fatalf("program %d Services with iptables-%s in %s: %v", services, v, top.node.NetNS.Name, err)
		}
		tb.Logf("iptables-%s: %d Services written in %s", v, services, time.Since(start).Round(time.Millisecond))
		r.served[string(v)] = true
	}
	r.pass, err = ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}}) // TC_ACT_OK
	if err != nil {
		tb.Fatalf("load the tc pass program: %v", err)
	}
	tb.Cleanup(func() {
		r.detachPass(tb)
		r.pass.Close()
	})
	setClientSysctls(tb, top.client.NetNS)
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

// use makes side the one that serves the NodePort: it bypasses the others.
func (r *benchRig) use(tb testing.TB, side string) {
	tb.Helper()
	if side == sideKpr {
		r.detachPass(tb)
	} else {
		r.attachPass(tb)
	}
	for _, v := range r.variants {
		want := side == iptablesSide(v)
		if r.served[string(v)] == want {
			continue
		}
		verb := "-I"
		if want {
			verb = "-D"
		}
		var in bytes.Buffer
		for _, t := range []struct{ table, chains string }{{"filter", "INPUT FORWARD OUTPUT"}, {"nat", "PREROUTING OUTPUT POSTROUTING"}} {
			fmt.Fprintf(&in, "*%s\n", t.table)
			for _, c := range strings.Fields(t.chains) {
				fmt.Fprintf(&in, "%s %s -m comment --comment \"kpr tc benchmark: bypass\" -j ACCEPT\n", verb, c)
			}
			in.WriteString("COMMIT\n")
		}
		if _, err := r.run.Run(iptables.ToolsFor(v, iptables.IPv4).Restore, []string{"--noflush"}, in.Bytes()); err != nil {
			tb.Fatalf("bypass iptables-%s (%s): %v", v, verb, err)
		}
		r.served[string(v)] = want
	}
}

func (r *benchRig) attachPass(tb testing.TB) {
	tb.Helper()
	if r.tcPass != nil {
		return
	}
	dev, err := r.top.node.NetNS.Netlink().LinkByName(extDev)
	if err != nil {
		tb.Fatal(err)
	}
	// A tcx attachment names its device by index in the caller's network
	// namespace.
	err = netnsexec.InPath(r.top.node.NetNS.Path, func() error {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			l, err := link.AttachTCX(link.TCXOptions{Interface: dev.Attrs().Index, Program: r.pass, Attach: at, Anchor: link.Head()})
			if err != nil {
				return fmt.Errorf("attach the pass program before kpr's on %s (%s): %w", extDev, at, err)
			}
			r.tcPass = append(r.tcPass, l)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func (r *benchRig) detachPass(tb testing.TB) {
	tb.Helper()
	for _, l := range r.tcPass {
		if err := l.Close(); err != nil {
			tb.Errorf("detach the tc pass program: %v", err)
		}
	}
	r.tcPass = nil
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
	return fmt.Sprintf("%6.0f req/s  p50 %5.0f µs  p99 %6.0f µs  CPU %4.0f µs/request",
		r.rate(), us(r.quantile(0.50)), us(r.quantile(0.99)), us(r.cpuPerRequest()))
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
func (r *benchRig) round(tb testing.TB, side string, d time.Duration, clients int) roundResult {
	tb.Helper()
	r.use(tb, side)
	if err := r.top.node.NetNS.Netlink().ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		tb.Fatalf("flush the node namespace's conntrack table: %v", err)
	}
	r.top.flushConntrack()
	load(r.top.client.NetNS, r.fe, clients, d/10)
	kprBefore, iptBefore := r.top.stats(), r.nodePortPackets(tb, side)
	cpu0 := processCPU(tb)
	res := load(r.top.client.NetNS, r.fe, clients, d)
	res.cpu = processCPU(tb) - cpu0
	kprAfter := r.top.stats()
	kprFlows, iptPackets := kprAfter.NewFlows-kprBefore.NewFlows, r.nodePortPackets(tb, side)-iptBefore
	if res.failed > 0 && side == sideKpr {
		// Say whether kpr's programs dropped what failed.
		res.firstErr = fmt.Errorf("%w (kpr's drops in the round: conntrack insert %d, rewrite %d, no backend %d)", res.firstErr,
			kprAfter.DropCtInsert-kprBefore.DropCtInsert, kprAfter.DropRewrite-kprBefore.DropRewrite, kprAfter.DropNoBackend-kprBefore.DropNoBackend)
	}
	n := uint64(len(res.latencies))
	switch {
	case side == sideKpr && kprFlows < n:
		tb.Fatalf("kpr round: %d requests served but kpr's programs saw %d new flows", n, kprFlows)
	case side != sideKpr && kprFlows != 0:
		tb.Fatalf("%s round: kpr's programs created %d flows: the bypass failed", side, kprFlows)
	case side != sideKpr && iptPackets < n:
		tb.Fatalf("%s round: %d requests served but the NodePort rule counted %d packets", side, n, iptPackets)
	}
	return res
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
// rule in the tables of side's variant (0 for kpr).
func (r *benchRig) nodePortPackets(tb testing.TB, side string) uint64 {
	tb.Helper()
	for _, v := range r.variants {
		if side != iptablesSide(v) {
			continue
		}
		out, err := r.run.Run(iptables.ToolsFor(v, iptables.IPv4).Save, []string{"-c", "-t", "nat"}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			// [packets:bytes] -A KUBE-NODEPORTS ... --dport N ...
			counters, rule, ok := strings.Cut(l, " ")
			if !ok || !strings.HasPrefix(rule, "-A KUBE-NODEPORTS ") || !strings.Contains(rule+" ", fmt.Sprintf(" --dport %d ", r.fe.Port())) {
				continue
			}
			pkts, _, _ := strings.Cut(strings.Trim(counters, "[]"), ":")
			n, err := strconv.ParseUint(pkts, 10, 64)
			if err != nil {
				tb.Fatalf("counters of %q: %v", l, err)
			}
			return n
		}
		tb.Fatalf("no KUBE-NODEPORTS rule for port %d in iptables-%s-save", r.fe.Port(), v)
	}
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
