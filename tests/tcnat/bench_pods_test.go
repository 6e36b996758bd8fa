package tcnat

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/harness"
)

// Requests per second and latency from a pod through a ClusterIP, for
// the two paths of --socket-lb per-pod and for kube-proxy-style iptables
// rules, in the same run:
//
//   - packet: a bypassed pod (its namespace in kpr_sock_bypass), served
//     by the packet path's programs on its veth (bpf/tc_pod.c);
//   - socket: a pod the socket hooks serve, on the same node and kpr;
//   - direct: that pod straight to a backend's address, the baseline of
//     the socket path's cost;
//   - iptables-legacy, iptables-nft: a pod on a node of its own whose
//     Services are kube-proxy's rules (kpr's own iptables renderer, as in
//     BenchmarkNodePortRequests), bridged traffic through netfilter as
//     kube-proxy needs it (br_netfilter).
//
// Every node has the same backends and the same Services. Rounds alternate
// as in BenchmarkNodePortRequests (alternateRounds). docs/dataplane-benchmark.md has the
// results.
//
//	go test ./tests/tcnat -run '^$' -bench PodClusterIPRequests -benchtime 1x
func BenchmarkPodClusterIPRequests(b *testing.B) {
	variants, err := parseVariants(*benchIPTables)
	if err != nil {
		b.Fatal(err)
	}
	r := newPodBenchRig(b, *benchServices, variants)
	b.Logf("%d Services in each dataplane; target %s; %d clients, %d rounds of %s per side", *benchServices, r.fe, *benchClients, *benchRounds, *benchRound)
	for _, s := range r.sides {
		r.round(b, s, *benchRound/3, *benchClients)
	}
	results := alternateRounds(r.sides, func(s *podSide) string { return s.name }, func(s *podSide) roundResult {
		return r.round(b, s, *benchRound, *benchClients)
	})
	for _, s := range r.sides {
		p := pool(results[s.name])
		b.Logf("all rounds: %-16s %s", s.name, p)
		b.ReportMetric(p.rate(), s.name+"-req/s")
		b.ReportMetric(us(p.quantile(0.50)), s.name+"-p50-µs")
		b.ReportMetric(us(p.cpuPerRequest()), s.name+"-cpu-µs/req")
	}
	ratio := func(a, c string) {
		var rs []float64
		for i := range results[a] {
			rs = append(rs, results[a][i].rate()/results[c][i].rate())
		}
		slices.Sort(rs)
		pa, pc := pool(results[a]), pool(results[c])
		b.Logf("%s / %s request rate: %.2fx overall, per round pair (sorted) %s; p50 latency %.2fx; CPU per request %.2fx",
			a, c, pa.rate()/pc.rate(), formatRatios(rs), us(pa.quantile(0.5))/us(pc.quantile(0.5)),
			float64(pa.cpuPerRequest())/float64(pc.cpuPerRequest()))
		b.ReportMetric(pa.rate()/pc.rate(), a+"/"+c)
	}
	for _, s := range r.sides {
		if s.variant != "" {
			ratio(podSidePacket, s.name)
		}
	}
	ratio(podSidePacket, podSideSocket)
	ratio(podSideSocket, podSideDirect)
}

const (
	podSidePacket = "packet"
	podSideSocket = "socket"
	podSideDirect = "direct"
)

// podBenchRig is the nodes of BenchmarkPodClusterIPRequests.
type podBenchRig struct {
	fe     netip.AddrPort // the target ClusterIP
	sides  []*podSide
	loaded *loader.Loaded
	kprNS  *harness.NetNS
}

// podSide is one client pod and the path its requests take.
type podSide struct {
	name    string
	client  *harness.Pod
	to      netip.AddrPort
	node    *harness.NetNS
	variant netfilter.Variant // of an iptables side
}

// podBenchNode is a node with the benchmark's two backends serving TCP.
func podBenchNode(tb testing.TB) (*harness.Node, []netip.AddrPort) {
	tb.Helper()
	node, err := harness.NewNode(tb, harness.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	var backends []netip.AddrPort
	for i := 0; i < benchPods; i++ {
		pod, err := node.AddPod(fmt.Sprintf("backend-%d", i))
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := pod.ServeTCP(echoPort); err != nil {
			tb.Fatal(err)
		}
		backends = append(backends, netip.AddrPortFrom(pod.IPv4, echoPort))
	}
	return node, backends
}

func newPodBenchRig(tb testing.TB, services int, variants []netfilter.Variant) *podBenchRig {
	tb.Helper()
	harness.RequireRoot(tb)
	if !loader.Probe().Has(loader.FeatureNetnsCookieSockopt) {
		tb.Skip("the kernel lacks SO_NETNS_COOKIE (Linux 5.14+): --socket-lb per-pod runs as all, without the packet path")
	}
	node, backends := podBenchNode(tb)
	all, _ := dressedServices(services, node.GatewayV4.Addr(), backends)
	r := &podBenchRig{kprNS: node.NetNS}
	for _, sp := range all {
		if sp.Name.Name == fmt.Sprintf("svc-%05d", services/2) {
			r.fe = netip.AddrPortFrom(sp.Frontends[0].Addr, sp.Frontends[0].Port)
		}
	}
	cg, err := harness.NewCgroup(tb)
	if err != nil {
		tb.Fatal(err)
	}
	r.loaded, err = loader.Load(loader.Options{BPFRoot: newBPFRoot(tb), CgroupRoot: cg.Path, HostNetNS: node.NetNS.Path,
		SocketLB: loader.SocketLBPerPod, PodTC: &loader.TCOptions{NetNS: node.NetNS.Path}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.loaded.Close() })
	lb, err := maps.New(r.loaded.Maps)
	if err != nil {
		tb.Fatal(err)
	}
	if err := ebpfplane.New(lb, zap.NewNop()).Reconcile(all); err != nil {
		tb.Fatalf("program %d Services into kpr's maps: %v", services, err)
	}
	bypass := maps.NewSockBypass(r.loaded.Maps.KprSockBypass)
	bypassPod := func(p *harness.Pod) {
		cookie, err := loader.NetNSCookie(p.NetNS.Path)
		if err != nil {
			tb.Fatal(err)
		}
		if err := bypass.Set(cookie, maps.SockBypassSandbox); err != nil {
			tb.Fatal(err)
		}
	}
	addClient := func(n *harness.Node, name string) *harness.Pod {
		p, err := n.AddPod(name)
		if err != nil {
			tb.Fatal(err)
		}
		setClientSysctls(tb, p.NetNS)
		return p
	}
	packet, socket := addClient(node, "packet-client"), addClient(node, "socket-client")
	bypassPod(packet)
	if err := r.loaded.PodTC.SetDevices([]string{packet.HostVeth}); err != nil {
		tb.Fatal(err)
	}
	r.sides = []*podSide{
		{name: podSidePacket, client: packet, to: r.fe, node: node.NetNS},
		{name: podSideSocket, client: socket, to: r.fe, node: node.NetNS},
		{name: podSideDirect, client: socket, to: backends[0], node: node.NetNS},
	}
	for _, v := range variants {
		n, bes := podBenchNode(tb)
		if !slices.Equal(bes, backends) {
			tb.Fatalf("iptables-%s: the node's pods are %v, kpr's %v", v, bes, backends)
		}
		client := addClient(n, "client")
		// The socket hooks see every socket of the test process: the
		// iptables node's client is left alone, as a pod of a node
		// without kpr.
		bypassPod(client)
		run := netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", n.NetNS.Name}}
		p, err := iptables.New(iptables.Options{Runner: run, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4)}})
		if err != nil {
			tb.Fatal(err)
		}
		if err := p.Reconcile(all); err != nil {
			tb.Fatalf("program %d Services with iptables-%s in %s: %v", services, v, n.NetNS.Name, err)
		}
		r.sides = append(r.sides, &podSide{name: "iptables-" + string(v), client: client, to: r.fe, node: n.NetNS, variant: v})
	}
	// Last: the socket side's client is the test process's own thread.
	if err := cg.EnterProcess(); err != nil {
		tb.Fatal(err)
	}
	return r
}

// round measures side for d after a short warm-up, and fails unless the
// path named served every request: the packet path's new flows, the socket
// hooks' translations, netfilter's conntrack on an iptables node, and none
// of them for a side that is not theirs.
func (r *podBenchRig) round(tb testing.TB, s *podSide, d time.Duration, clients int) roundResult {
	tb.Helper()
	if s.variant != "" {
		if err := netfilterNetlink(tb, s.node).ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			tb.Fatalf("flush the conntrack table of %s: %v", s.node.Name, err)
		}
	}
	load(s.client.NetNS, s.to, clients, d/10)
	flows0, sock0 := r.newFlows(tb), r.socketTranslations(tb)
	cpu0 := processCPU(tb)
	res := load(s.client.NetNS, s.to, clients, d)
	res.cpu = processCPU(tb) - cpu0
	n := uint64(len(res.latencies))
	flows, sock := r.newFlows(tb)-flows0, r.socketTranslations(tb)-sock0
	switch {
	case s.name == podSidePacket && flows < n:
		tb.Fatalf("packet round: %d requests served but the packet path saw %d new flows", n, flows)
	case s.name == podSideSocket && sock < n:
		tb.Fatalf("socket round: %d requests served but the socket hooks translated %d connects", n, sock)
	case s.name != podSidePacket && flows != 0:
		tb.Fatalf("%s round: the packet path saw %d new flows", s.name, flows)
	case s.name != podSideSocket && sock != 0:
		tb.Fatalf("%s round: the socket hooks translated %d connects", s.name, sock)
	}
	tracked := nfConntrackCount(tb, s.node)
	if s.variant != "" && tracked == 0 {
		tb.Fatalf("%s round: netfilter's conntrack table in %s is empty after %d requests", s.name, s.node.Name, n)
	}
	if s.variant == "" && tracked != 0 {
		tb.Fatalf("%s round: netfilter tracked %d connections in kpr's node namespace", s.name, tracked)
	}
	return res
}

func (r *podBenchRig) newFlows(tb testing.TB) uint64 {
	tb.Helper()
	var n uint64
	err := maps.NewTCStatsReader(r.loaded.Maps).Counters(func(name string, v uint64) {
		if name == "NewFlows" {
			n = v
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func (r *podBenchRig) socketTranslations(tb testing.TB) uint64 {
	tb.Helper()
	var n uint64
	err := ebpfplane.SockCounts(r.loaded.Maps.KprSockStats)(func(h metrics.SockHookCounts) {
		if h.Hook == "connect4" {
			n = h.Translated
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// A short run of every side on a few Services: each path serves, and each
// round's checks hold.
func TestPodBenchRigServesEverySide(t *testing.T) {
	variants, err := parseVariants(*benchIPTables)
	if err != nil {
		t.Fatal(err)
	}
	r := newPodBenchRig(t, 20, variants)
	for _, s := range r.sides {
		if res := r.round(t, s, *benchRound/10, 2); len(res.latencies) == 0 || res.failed > 0 {
			t.Errorf("%s: %d requests, %d failed%s", s.name, len(res.latencies), res.failed, firstFailure(res))
		}
	}
}
