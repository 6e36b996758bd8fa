package tcnat

import (
	"bufio"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
	"github.com/kpr-io/kpr/tests/harness"
)

// The flow hash has a secret (issue 20, "predictable choices"): the node's
// for the random backend pick and the SNAT port, the cluster's for Maglev.
// These tests predict the programs' choices from a model of the hash: with
// the secret, every choice is predicted; without it (seed 0, which is the
// hash as it was before it had a secret), almost none.

// lbHash64 and flowHash model lb_hash64 (bpf/lb.h) and flow_hash
// (bpf/pkt.h) for an IPv4 flow as ingress parses it: addresses as
// v4-mapped words, ports in network order.
func lbHash64(x uint64) uint32 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return uint32(x)
}

func flowHash(client netip.AddrPort, dport uint16, proto uint8, seed uint64) uint32 {
	s := addr16(client.Addr())
	a := uint64(s[0]^s[2])<<32 | uint64(s[1]^s[3])
	b := (uint64(htons(client.Port()))<<16 | uint64(htons(dport))) ^ uint64(proto)<<32
	return lbHash64(a ^ uint64(lbHash64(b^seed)))
}

// nodeSeed is the node's secret, as the loader left it in the pinned map.
func nodeSeed(t *testing.T, loaded *loader.Loaded) uint64 {
	t.Helper()
	var seed uint64
	if err := loaded.Maps.KprNodeSeed.Lookup(uint32(0), &seed); err != nil {
		t.Fatalf("read %s: %v", bpf.KprMapKprNodeSeed, err)
	}
	if seed == 0 {
		t.Fatalf("%s holds no secret", bpf.KprMapKprNodeSeed)
	}
	return seed
}

// slotBackends maps each backend slot of the node's only frontend to the
// address of the backend in it.
func slotBackends(t *testing.T, p *progs) map[uint16]netip.Addr {
	t.Helper()
	out := map[uint16]netip.Addr{}
	var k bpf.KprSvcKey
	var v bpf.KprSvcValue
	it := p.loaded.Maps.KprServices.Iterate()
	for it.Next(&k, &v) {
		if k.Slot == 0 {
			continue
		}
		var be bpf.KprBackend
		if err := p.loaded.Maps.KprBackends.Lookup(v.BackendId, &be); err != nil {
			t.Fatalf("backend %d of slot %d: %v", v.BackendId, k.Slot, err)
		}
		var b [16]byte
		for i, w := range be.Addr {
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
		}
		out[k.Slot] = netip.AddrFrom16(b).Unmap()
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

const seededFlows = 500

// The random pick of a new flow's backend is the node's secret hash of the
// flow: every flow goes where the secret says, hardly any where the
// unseeded hash would send it, and another node (another secret) sends
// most flows elsewhere. A kpr restart that keeps the pins keeps the secret,
// so a flow whose conntrack entry is gone picks the same backend again.
func TestRandomPickFollowsTheNodeSecret(t *testing.T) {
	fe := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.81"), 30080)
	var backends []netip.AddrPort
	for _, a := range maglevBackends(10) {
		backends = append(backends, netip.AddrPortFrom(a, 8080))
	}
	a, b := newProgs(t, loader.ConntrackTimeouts{}), newProgs(t, loader.ConntrackTimeouts{})
	for _, n := range []*progs{a, b} {
		n.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, backends...)
	}
	seedA, seedB := nodeSeed(t, a.loaded), nodeSeed(t, b.loaded)
	if seedA == seedB {
		t.Fatalf("two nodes drew the same secret %#x", seedA)
	}
	slots := slotBackends(t, a)
	if len(slots) != len(backends) {
		t.Fatalf("%d backend slots, want %d", len(slots), len(backends))
	}
	client := netip.MustParseAddr("198.51.100.7")
	pick := func(n *progs, port uint16) netip.Addr {
		t.Helper()
		ret, got := n.in(flow{src: netip.AddrPortFrom(client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "S"})
		if ret != actUnspec {
			t.Fatalf("flow from port %d: verdict %d, want it translated and passed on", port, int32(ret))
		}
		return got.dst.Addr()
	}
	predict := func(port uint16, seed uint64) netip.Addr {
		return slots[uint16(flowHash(netip.AddrPortFrom(client, port), fe.Port(), unix.IPPROTO_TCP, seed)%uint32(len(slots)))+1]
	}
	before := make([]netip.Addr, seededFlows)
	unseeded, sameOnB := 0, 0
	for i := range before {
		port := uint16(20000 + i)
		before[i] = pick(a, port)
		if want := predict(port, seedA); before[i] != want {
			t.Fatalf("flow from port %d went to %s; the node's secret sends it to %s", port, before[i], want)
		}
		if before[i] == predict(port, 0) {
			unseeded++
		}
		if pick(b, port) == before[i] {
			sameOnB++
		}
	}
	// By chance, a tenth of the flows land where the other hash would
	// put them.
	if unseeded > seededFlows/4 {
		t.Errorf("%d of %d flows went where the unseeded hash sends them", unseeded, seededFlows)
	}
	if sameOnB > seededFlows/4 {
		t.Errorf("%d of %d flows went to the same backend on a node with another secret", sameOnB, seededFlows)
	}

	// kpr restarts over the pins of node a.
	restarted := loadDataplane(t, a.loaded.BPFRoot, &loader.TCOptions{})
	if got := nodeSeed(t, restarted); got != seedA {
		t.Fatalf("after a restart that kept the pins the secret is %#x, before %#x", got, seedA)
	}
	a.flushConntrack()
	a.ingress, a.egress = restarted.TC.Ingress, restarted.TC.Egress
	for i, was := range before {
		if got := pick(a, uint16(20000+i)); got != was {
			t.Fatalf("after the restart, the flow from port %d went to %s, before to %s", 20000+i, got, was)
		}
	}
}

// The SNAT port of a flow to a backend on another node starts its search
// where the node's secret hash of the flow says (the next ones if taken):
// real connections, through a LAN. An outsider who knows the flow cannot
// tell its port. A restart that keeps the pins keeps the secret.
func TestSNATPortFollowsTheNodeSecret(t *testing.T) {
	l := newLAN(t, loader.TCOptions{})
	const peerPort = 9000
	peerServer(t, l.remote, peerPort)
	fe := netip.AddrPortFrom(nodeAddr(false), 30093)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), peerPort)...)
	ports, err := loader.DefaultSNATPorts()
	if err != nil {
		t.Fatal(err)
	}
	span := uint32(ports.Last) - uint32(ports.First) + 1
	// startsAt tells whether port is where the search for client's flow
	// starts under seed, or one of the next few (ports of earlier flows
	// of this test may be taken).
	startsAt := func(port uint16, client netip.AddrPort, seed uint64) bool {
		start := flowHash(client, fe.Port(), unix.IPPROTO_TCP, seed) % span
		return (uint32(port-ports.First)+span-start)%span < 8
	}
	seed := nodeSeed(t, l.loaded)
	const flows = 30
	check := func(when string) {
		t.Helper()
		unseeded := 0
		for i := 0; i < flows; i++ {
			client, snat := askPeerFrom(t, l.client.NetNS, fe)
			if snat.Addr() != nodeAddr(false) {
				t.Fatalf("the remote pod saw the flow from %s, want the node's address", snat)
			}
			if !startsAt(snat.Port(), client, seed) {
				t.Fatalf("%s: flow from %s got SNAT port %d, not where the node's secret starts it (%d)", when, client, snat.Port(),
					uint32(ports.First)+flowHash(client, fe.Port(), unix.IPPROTO_TCP, seed)%span)
			}
			if startsAt(snat.Port(), client, 0) {
				unseeded++
			}
		}
		if unseeded > 1 {
			t.Errorf("%s: %d of %d flows got the SNAT port the unseeded hash gives them", when, unseeded, flows)
		}
	}
	check("first start")

	tcOpts := loader.TCOptions{Devices: []string{extDev}, NetNS: l.node1.NetNS.Path}
	restarted := loadDataplane(t, l.loaded.BPFRoot, &tcOpts)
	if got := nodeSeed(t, restarted); got != seed {
		t.Fatalf("after a restart that kept the pins the secret is %#x, before %#x", got, seed)
	}
	check("after a restart")
}

// askPeerFrom connects to fe from ns and returns the connection's own
// address and the one the peer server saw.
func askPeerFrom(t *testing.T, ns *harness.NetNS, fe netip.AddrPort) (client, seen netip.AddrPort) {
	t.Helper()
	client, line := greetingFrom(t, ns, fe)
	seen, err := netip.ParseAddrPort(line)
	if err != nil {
		t.Fatal(err)
	}
	return client, netip.AddrPortFrom(seen.Addr().Unmap(), seen.Port())
}

// greetingFrom connects to fe from ns and returns the connection's own
// address and the server's first line.
func greetingFrom(t *testing.T, ns *harness.NetNS, fe netip.AddrPort) (client netip.AddrPort, line string) {
	t.Helper()
	c, err := harness.DialTCP(ns, fe, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if line, err = bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	local, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), strings.TrimSpace(line)
}

// Maglev takes the cluster's seed: nodes that share it build the same table
// and hash a flow alike, so each flow goes to the one backend the seed's
// table and hash name; a cluster with another seed sends most flows
// elsewhere.
func TestMaglevFollowsTheClusterSeed(t *testing.T) {
	const size = 1021
	const seed, otherSeed = 0x1234567890abcdef, 0xfedcba0987654321
	a, b := newSeededMaglevNode(t, size, seed), newSeededMaglevNode(t, size, seed)
	other := newSeededMaglevNode(t, size, otherSeed)
	backends := maglevBackends(10)
	a.apply(lbService("web", 0, backends...))
	b.apply(lbService("web", 0, reversed(backends)...))
	other.apply(lbService("web", 0, backends...))

	names := make([]string, len(backends))
	for i, be := range backends {
		names[i] = netip.AddrPortFrom(be, 8080).String()
	}
	table, err := maglev.Build(names, size, seed)
	if err != nil {
		t.Fatal(err)
	}
	fe := ap(maglevLB, 80)
	client := netip.MustParseAddr("198.51.100.7")
	elsewhere := 0
	for port := uint16(20000); port < 20000+seededFlows; port++ {
		pa, pb, po := a.pick(client, port, fe), b.pick(client, port, fe), other.pick(client, port, fe)
		want := backends[table[flowHash(netip.AddrPortFrom(client, port), fe.Port(), unix.IPPROTO_TCP, seed)%size]]
		if pa != want || pb != want {
			t.Fatalf("flow from port %d went to %s on node a and %s on node b; the cluster's seed sends it to %s", port, pa, pb, want)
		}
		if po != pa {
			elsewhere++
		}
	}
	// About a tenth of the flows land on the same backend by chance.
	if elsewhere < seededFlows*3/4 {
		t.Errorf("only %d of %d flows went elsewhere in a cluster with another seed", elsewhere, seededFlows)
	}
}

// `kpr run --lb-algorithm maglev` against a real API server takes the
// cluster's seed from the kube-system Namespace's UID: real connections
// from outside each reach the pod that the UID's table and hash name.
func TestKprRunMaglevSeedsFromTheCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName = "kpr-tcnat-maglev"
	const size = 251
	cl, api := testCluster(ctx, t, nodeName)
	top := buildTopology(t, 3)
	runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--devices", extDev, "--lb-algorithm", "maglev", "--maglev-table-size", "251")
	fe := createNodePort(ctx, t, api, "tcnat-maglev", nodeName, top.pods...)
	waitWho(t, top.client.NetNS, fe, len(top.pods))

	ks, err := api.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seed := maglev.SeedOf(string(ks.UID))
	names := make([]string, len(top.pods))
	for i, p := range top.pods {
		names[i] = netip.AddrPortFrom(p.IPv4, echoPort).String()
	}
	table, err := maglev.Build(names, size, seed)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 24; i++ {
		client, who := greetingFrom(t, top.client.NetNS, fe)
		want := top.pods[table[flowHash(client, fe.Port(), unix.IPPROTO_TCP, seed)%size]].Name
		if who != want {
			t.Fatalf("the flow from %s reached %s; the cluster's seed (kube-system's UID %s) sends it to %s", client, who, ks.UID, want)
		}
	}
}
