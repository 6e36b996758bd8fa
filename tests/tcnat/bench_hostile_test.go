package tcnat

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// The request benchmark under a spoofed SYN flood (issue 20, Benchmark): a
// legitimate external client opens a new connection per request to a
// NodePort whose backends are pods of another node (so every flow is
// SNATed), while an attacker sends SYNs to the same NodePort from tens of
// thousands of spoofed source addresses, at rising rates. The same sides
// as BenchmarkNodePortRequests, the same Services, each side in a topology
// of its own:
//
//	client netns: bridge lan0, the legitimate client 192.168.100.2
//	   |- node1 ext0 192.168.100.10  (kpr's tc programs, or kube-proxy's iptables rules)
//	   |- node2 ext0 192.168.100.11  backend pods 10.244.1.2, .3
//	   `- attacker 192.168.100.3     raw socket: SYNs from 198.18.0.0/15
//
// node1 routes 198.18.0.0/15 to the attacker's namespace, which blackholes
// it: the SYN-ACKs the backends send to the spoofed sources die there, so
// nothing answers them, as on the internet. Every packet stays inside the
// test's namespaces.
//
// Each flood rate gets its own quarter of 198.18.0.0/15 (32,768 sources),
// so the flows a rate's flood left can be told apart from the next rate's:
// the benchmark counts them at the end of the flood, while it still runs,
// and again a while after it stopped (-tchostile.after).
//
//	go test ./tests/tcnat -run '^$' -bench NodePortHostile -benchtime 1x -timeout 60m
var (
	hostileRates   = flag.String("tchostile.rates", "500,1000,2000,5000", "spoofed SYNs per second, one flood per rate, in this order")
	hostileFlood   = flag.Duration("tchostile.flood", 60*time.Second, "length of each flood, during which the legitimate client is measured")
	hostileAfter   = flag.Duration("tchostile.after", 120*time.Second, "when, after a flood stops, the entries it left are counted again")
	hostileClients = flag.Int("tchostile.clients", 2, "concurrent loops of the legitimate client, each one request at a time")
	hostileDoc     = flag.String("tchostile.doc", "", "a document whose hostile-benchmark section (between its markers) gets the results")
)

var (
	// floodSources is where spoofed SYNs come from (RFC 2544's benchmark
	// range): nothing in the topology but the attacker's blackhole.
	floodSources = netip.MustParsePrefix("198.18.0.0/15")
	attackerAddr = netip.MustParsePrefix("192.168.100.3/24")
)

func BenchmarkNodePortHostile(b *testing.B) {
	rates, err := parseRates(*hostileRates)
	if err != nil {
		b.Fatal(err)
	}
	variants, err := parseVariants(*benchIPTables)
	if err != nil {
		b.Fatal(err)
	}
	r := newHostileRig(b, *benchServices, variants)
	b.Logf("%d Services in each dataplane; target %s, backends on another node; %d legitimate client loops; floods of %s at %v SYN/s, counted again %s after",
		*benchServices, r.fe, *hostileClients, *hostileFlood, rates, *hostileAfter)
	res := r.run(b, rates, *hostileFlood, *hostileAfter, *hostileClients)
	table := res.markdown()
	fmt.Print(table)
	if *hostileDoc != "" {
		if err := replaceDocSection(*hostileDoc, res.docSection()); err != nil {
			b.Error(err)
		}
	}
	for _, t := range res.targets() {
		if !t.met {
			b.Errorf("target not met: %s: %s", t.name, t.detail)
		}
	}
	for _, s := range res.sides {
		b.ReportMetric(float64(res.highestClean(s)), s+"-clean-SYN/s")
	}
}

// A flood of each of two rates through kpr and iptables-legacy, one second
// each: the flood reaches the node and is counted on both sides, and the
// legitimate client is served. The targets are the benchmark's, not this
// test's: a second is too short to judge them.
func TestHostileBenchSmoke(t *testing.T) {
	r := newHostileRig(t, 10, []netfilter.Variant{netfilter.Legacy})
	res := r.run(t, []int{200, 1000}, time.Second, 2*time.Second, 1)
	t.Log("\n" + res.markdown())
	for _, w := range res.windows {
		if w.Served == 0 {
			t.Errorf("%s at %d SYN/s: the legitimate client was not served (%d failed)", w.Side, w.Rate, w.Failed)
		}
		if w.Sent == 0 || w.During.Entries == 0 {
			t.Errorf("%s at %d SYN/s: %d spoofed SYNs sent, %d of their entries counted during the flood", w.Side, w.Rate, w.Sent, w.During.Entries)
		}
		if w.During.SNATPorts == 0 {
			t.Errorf("%s at %d SYN/s: no SNAT port counted for the flood: the backends are not remote, or the count misses them", w.Side, w.Rate)
		}
		if !w.After.Taken || w.After.At < 2*time.Second {
			t.Errorf("%s at %d SYN/s: entries counted again %s after the flood (taken: %v), want 2s", w.Side, w.Rate, w.After.At, w.After.Taken)
		}
	}
}

// parseRates reads a comma-separated list of positive rates.
func parseRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &n); err != nil || n <= 0 || fmt.Sprint(n) != strings.TrimSpace(f) {
			return nil, fmt.Errorf("flood rate %q in %q: want a positive whole number of SYNs per second", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseVariants reads -tcbench.iptables.
func parseVariants(s string) ([]netfilter.Variant, error) {
	var out []netfilter.Variant
	for _, v := range strings.Split(s, ",") {
		switch netfilter.Variant(v) {
		case netfilter.Legacy, netfilter.NFT:
			out = append(out, netfilter.Variant(v))
		case "":
		default:
			return nil, fmt.Errorf("-tcbench.iptables=%q: want legacy, nft or both, comma separated", s)
		}
	}
	return out, nil
}

// hostileRig is one LAN per side, each serving the same Services from the
// same remote pods.
type hostileRig struct {
	sides []*hostileSide // kpr first
	fe    netip.AddrPort
}

type hostileSide struct {
	name     string
	lan      *lan
	attacker *harness.Node
	nf       *netlink.Handle // netfilter's, in the node's namespace (iptables sides)
	// sampleMu serializes the counts: a netlink handle is not for
	// concurrent dumps.
	sampleMu sync.Mutex
}

func (s *hostileSide) kpr() bool { return s.name == sideKpr }

func newHostileRig(tb testing.TB, services int, variants []netfilter.Variant) *hostileRig {
	tb.Helper()
	r := &hostileRig{}
	var all map[dataplane.ServicePortName]*dataplane.ServicePort
	var backends []netip.AddrPort
	for _, name := range append([]string{sideKpr}, variantSides(variants)...) {
		s := &hostileSide{name: name, lan: buildLAN(tb, benchPods)}
		s.attacker = plugAttacker(tb, s.lan)
		got := peerBackends(nodeAddr(false), echoPort, s.lan.remotes...)
		if all == nil {
			backends = got
			all, r.fe = dressedServices(services, nodeAddr(false), backends)
		} else if !slices.Equal(got, backends) {
			tb.Fatalf("%s: the remote pods are %v, kpr's %v", name, got, backends)
		}
		start := time.Now()
		if s.kpr() {
			// The maps at the sizes kpr ships with.
			s.lan.loadKpr(tb, loader.TCOptions{}, loader.MapSizes{})
			if err := ebpfplane.New(s.lan.lb, zap.NewNop()).Reconcile(all); err != nil {
				tb.Fatalf("program %d Services into kpr's maps: %v", services, err)
			}
		} else {
			s.nf = netfilterNetlink(tb, s.lan.node1.NetNS)
			v := netfilter.Variant(strings.TrimPrefix(name, "iptables-"))
			run := netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", s.lan.node1.NetNS.Name}}
			p, err := iptables.New(iptables.Options{Runner: run, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4)}})
			if err != nil {
				tb.Fatal(err)
			}
			if err := p.Reconcile(all); err != nil {
				tb.Fatalf("program %d Services with %s in %s: %v", services, name, s.lan.node1.NetNS.Name, err)
			}
		}
		tb.Logf("%s: %d Services written in %s", name, services, time.Since(start).Round(time.Millisecond))
		setClientSysctls(tb, s.lan.client.NetNS)
		r.sides = append(r.sides, s)
	}
	// Every side serves before it is measured.
	for _, s := range r.sides {
		if res := load(s.lan.client.NetNS, r.fe, 1, 200*time.Millisecond); len(res.latencies) == 0 {
			tb.Fatalf("%s: the NodePort %s serves nothing before the flood%s", s.name, r.fe, firstFailure(res))
		}
	}
	return r
}

func variantSides(vs []netfilter.Variant) []string {
	var out []string
	for _, v := range vs {
		out = append(out, "iptables-"+string(v))
	}
	return out
}

// plugAttacker adds the attacker's namespace to l's LAN, and routes the
// spoofed sources from node1 to it, where they are blackholed.
func plugAttacker(tb testing.TB, l *lan) *harness.Node {
	tb.Helper()
	atk, err := harness.NewNode(tb, harness.Options{UplinkName: extDev,
		GatewayV4: netip.MustParsePrefix("10.251.0.1/24"), GatewayV6: netip.MustParsePrefix("fd00:251::1/64")})
	if err != nil {
		tb.Fatal(err)
	}
	if err := atk.AddAddress(attackerAddr); err != nil {
		tb.Fatal(err)
	}
	br, err := l.client.NetNS.Netlink().LinkByName("lan0")
	if err != nil {
		tb.Fatal(err)
	}
	plugInto(tb, atk, l.client, br, "lan-atk")
	p := floodSources
	if err := atk.NetNS.Netlink().RouteAdd(&netlink.Route{Type: unix.RTN_BLACKHOLE,
		Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}); err != nil {
		tb.Fatalf("blackhole %s in the attacker's namespace: %v", p, err)
	}
	route(tb, l.node1.NetNS, p.String(), attackerAddr.Addr())
	waitReachable(tb, atk.NetNS, nodeAddr(false))
	return atk
}

// run floods each side at each rate in turn (rate by rate, the sides in
// the same order), measures the legitimate client during each flood, and
// counts each flood's entries at its end and again after `after`, in the
// background while the next floods run.
func (r *hostileRig) run(tb testing.TB, rates []int, flood, after time.Duration, clients int) *hostileResults {
	tb.Helper()
	res := &hostileResults{rates: rates, flood: flood, after: after}
	for _, s := range r.sides {
		res.sides = append(res.sides, s.name)
	}
	var pending sync.WaitGroup
	var mu sync.Mutex
	var afterErr error
	for i, rate := range rates {
		block := sourceBlock(i, len(rates))
		for _, s := range r.sides {
			var before bpf.KprNatStats
			if s.kpr() {
				before = s.lan.stats()
			}
			f, err := startFlood(s.attacker.NetNS, r.fe, block, rate)
			if err != nil {
				tb.Fatalf("%s: start the flood: %v", s.name, err)
			}
			legit := load(s.lan.client.NetNS, r.fe, clients, flood)
			during, err := s.count(block)
			sent, floodTime, ferr := f.stop()
			stopped := time.Now()
			if err = errors.Join(err, ferr); err != nil {
				tb.Fatalf("%s at %d SYN/s: %v", s.name, rate, err)
			}
			w := &hostileWindow{Side: s.name, Rate: rate, Sent: sent, SentRate: float64(sent) / floodTime.Seconds(),
				Served: len(legit.latencies), Failed: legit.failed, Slow: legit.slowerThan(900 * time.Millisecond), Elapsed: legit.elapsed, During: during}
			if legit.failed > 0 {
				w.Note = "first failure: " + legit.firstErr.Error()
			}
			if s.kpr() {
				a := s.lan.stats()
				// A segment of no flow kpr knows (tcp_midstream) goes to
				// the node, which resets it: a legitimate connection
				// whose entries were lost shows here.
				w.Note = strings.TrimPrefix(fmt.Sprintf("%s; kpr: %d SNAT ports taken over, %d segments of no known flow passed, drops: %s",
					w.Note, a.SnatTakeover-before.SnatTakeover, a.Midstream-before.Midstream, movedDrops(before, a)), "; ")
			}
			fmt.Printf("%-16s %5d SYN/s (sent %.0f/s): legitimate %6.0f req/s, %d served (%d slow), %d failed; flood holds %d entries, %d SNAT ports  %s\n",
				s.name, rate, w.SentRate, w.reqRate(), w.Served, w.Slow, w.Failed, during.Entries, during.SNATPorts, w.Note)
			res.windows = append(res.windows, w)
			pending.Add(1)
			time.AfterFunc(time.Until(stopped.Add(after)), func() {
				defer pending.Done()
				held, err := s.count(block)
				held.At = time.Since(stopped)
				mu.Lock()
				defer mu.Unlock()
				w.After = held
				afterErr = errors.Join(afterErr, err)
			})
		}
	}
	pending.Wait()
	if afterErr != nil {
		tb.Fatalf("count the entries the floods left: %v", afterErr)
	}
	return res
}

// sourceBlock is the part of floodSources that flood i of n sends from.
func sourceBlock(i, n int) netip.Prefix {
	bits := floodSources.Bits()
	for 1<<(bits-floodSources.Bits()) < n {
		bits++
	}
	base := binary.BigEndian.Uint32(floodSources.Addr().AsSlice())
	size := uint32(1) << (32 - bits)
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], base+uint32(i)*size)
	return netip.PrefixFrom(netip.AddrFrom4(a), bits)
}

// count counts the live entries and SNAT ports of the flows from block on
// s's node: kpr's conntrack map, or netfilter's table in the node's
// namespace.
func (s *hostileSide) count(block netip.Prefix) (floodHeld, error) {
	s.sampleMu.Lock()
	defer s.sampleMu.Unlock()
	if s.kpr() {
		return countKprFlood(s.lan, block)
	}
	flows, err := s.nf.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return floodHeld{}, fmt.Errorf("list netfilter's conntrack table in %s: %w", s.lan.node1.NetNS.Name, err)
	}
	held := floodHeld{Taken: true}
	for _, f := range flows {
		src, ok := netip.AddrFromSlice(f.Forward.SrcIP)
		if !ok || !block.Contains(src.Unmap()) {
			continue
		}
		held.Entries++
		// MASQUERADEd: the reply comes to the node's address and port.
		if dst, _ := netip.AddrFromSlice(f.Reverse.DstIP); dst.Unmap() != src.Unmap() {
			held.SNATPorts++
		}
	}
	return held, nil
}

// countKprFlood counts kpr's conntrack entries of the flows from block that
// have not expired (an LRU map keeps an expired entry until it evicts it,
// but the programs treat it as gone): each flow's forward entry, and its
// reply entry, which for a SNATed flow is the SNAT port it holds.
func countKprFlood(l *lan, block netip.Prefix) (floodHeld, error) {
	now, err := monotonic()
	if err != nil {
		return floodHeld{}, err
	}
	held := floodHeld{Taken: true}
	for _, m := range l.ctMaps() {
		var k bpf.KprCtKey
		var v bpf.KprCtValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			if v.ExpiresNs < now {
				continue
			}
			client := k.Saddr
			snat := v.Flags&ctFlagSNAT != 0
			if k.Dir == ctDirReply {
				client = k.Daddr
				if snat {
					client = v.NatAddr
				}
			}
			if !block.Contains(netip.AddrFrom16(addrBytes(client)).Unmap()) {
				continue
			}
			held.Entries++
			if k.Dir == ctDirReply && snat {
				held.SNATPorts++
			}
		}
		// An LRU map the programs write while it is read can abort the
		// walk; one retry later would count other flows: report it.
		if err := it.Err(); err != nil {
			return held, fmt.Errorf("walk kpr's conntrack map %s: %w", m, err)
		}
	}
	return held, nil
}

// ctFlagSNAT is CT_F_SNAT of enum ct_flags (bpf/types.h).
const ctFlagSNAT = 8

// addrBytes is a conntrack key's address as 16 bytes (IPv4 mapped).
func addrBytes(a [4]uint32) [16]byte {
	var b [16]byte
	for i, w := range a {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	return b
}

// monotonic is bpf_ktime_get_ns()'s clock.
func monotonic() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}

// flood sends spoofed SYNs from a raw socket in the attacker's namespace.
type flood struct {
	stopping atomic.Bool
	done     chan struct{}
	sent     int
	elapsed  time.Duration
	err      error
}

// startFlood sends rate SYNs a second to fe from the addresses of block,
// each from a random port with a random sequence number, until stopped.
func startFlood(ns *harness.NetNS, fe netip.AddrPort, block netip.Prefix, rate int) (*flood, error) {
	f := &flood{done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(f.done)
		f.err = harness.Do(ns, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
			ready <- err
			if err != nil {
				return fmt.Errorf("raw socket in %s: %w", ns.Name, err)
			}
			defer unix.Close(fd)
			to := &unix.SockaddrInet4{Addr: fe.Addr().As4()}
			hosts := uint32(1) << (32 - block.Bits())
			base := binary.BigEndian.Uint32(block.Addr().AsSlice())
			start := time.Now()
			for !f.stopping.Load() {
				due := int(time.Since(start).Seconds() * float64(rate))
				for ; f.sent < due; f.sent++ {
					var a [4]byte
					binary.BigEndian.PutUint32(a[:], base+uint32(f.sent)%hosts)
					src := netip.AddrPortFrom(netip.AddrFrom4(a), uint16(1024+rand.IntN(65536-1024)))
					if err := unix.Sendto(fd, synPacket(src, fe, rand.Uint32()), 0, to); err != nil {
						return fmt.Errorf("send a spoofed SYN from %s: %w", src, err)
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
			f.elapsed = time.Since(start)
			return nil
		})
	}()
	if err := <-ready; err != nil {
		<-f.done
		return nil, err
	}
	return f, nil
}

// stop ends the flood and returns the SYNs sent and over how long.
func (f *flood) stop() (int, time.Duration, error) {
	f.stopping.Store(true)
	<-f.done
	return f.sent, f.elapsed, f.err
}

// synPacket is an IPv4 TCP SYN from src to dst with sequence number seq and
// an MSS option, as a raw IPPROTO_RAW socket sends it: the kernel fills in
// the IP header's checksum, the TCP checksum is here.
func synPacket(src, dst netip.AddrPort, seq uint32) []byte {
	const ipLen, tcpLen = 20, 24
	p := make([]byte, ipLen+tcpLen)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], ipLen+tcpLen)
	binary.BigEndian.PutUint16(p[6:], 0x4000) // DF
	p[8] = 64
	p[9] = unix.IPPROTO_TCP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], ^onesSum(p[:ipLen], 0))
	t := p[ipLen:]
	binary.BigEndian.PutUint16(t[0:], src.Port())
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	binary.BigEndian.PutUint32(t[4:], seq)
	t[12] = tcpLen / 4 << 4
	t[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(t[14:], 64240)
	copy(t[20:], []byte{2, 4, 0x05, 0xb4}) // MSS 1460
	pseudo := make([]byte, 12)
	copy(pseudo, s[:])
	copy(pseudo[4:], d[:])
	pseudo[9] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(pseudo[10:], tcpLen)
	binary.BigEndian.PutUint16(t[16:], ^onesSum(t, onesSum(pseudo, 0)))
	return p
}

// replaceDocSection writes section between the hostile-benchmark markers of
// the document at path.
func replaceDocSection(path, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := spliceSection(string(doc), section)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

// movedDrops names every drop counter of the tc programs that moved
// between before and after, "none" if none did: where a legitimate
// client's lost packets went.
func movedDrops(before, after bpf.KprNatStats) string {
	var moved []string
	b, a := reflect.ValueOf(before), reflect.ValueOf(after)
	for i := 0; i < a.NumField(); i++ {
		name := a.Type().Field(i).Name
		if !strings.HasPrefix(name, "Drop") || a.Field(i).Kind() != reflect.Uint64 {
			continue
		}
		if d := a.Field(i).Uint() - b.Field(i).Uint(); d > 0 {
			moved = append(moved, fmt.Sprintf("%s %d", strings.TrimPrefix(name, "Drop"), d))
		}
	}
	if len(moved) == 0 {
		return "none"
	}
	return strings.Join(moved, ", ")
}
