package tcnat

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
)

// Maglev (kpr run --lb-algorithm maglev): nodes behind one ECMP router pick
// the same backend for a flow, and a backend change moves few flows. Each
// "node" here is a dataplane of its own (its own BPF root, so its own maps,
// backend ids and reverse-NAT ids), driven as kpr run drives it: an
// ebpfplane.Plane with a maps.Maglev.

// maglevNode is one node's dataplane with Maglev tables.
type maglevNode struct {
	*progs
	plane *ebpfplane.Plane
}

func newMaglevNode(t *testing.T, size uint32) *maglevNode {
	t.Helper()
	return newSeededMaglevNode(t, size, testClusterSeed)
}

// testClusterSeed stands for the cluster's Maglev seed, which every node
// shares.
const testClusterSeed = 0x6b7072206d61676c

// newSeededMaglevNode is a node of the cluster whose Maglev seed is seed.
func newSeededMaglevNode(t *testing.T, size uint32, seed uint64) *maglevNode {
	t.Helper()
	loaded := loadDataplane(t, newBPFRoot(t), &loader.TCOptions{MaglevTableSize: size, MaglevSeed: seed})
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		t.Fatal(err)
	}
	mg, err := maps.NewMaglev(lb, loaded.Maps.KprMaglev, size, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mg.Close() })
	plane := ebpfplane.New(lb, nil)
	plane.SetMaglev(mg)
	return &maglevNode{progs: &progs{t: t, loaded: loaded, lb: lb, ingress: loaded.TC.Ingress, egress: loaded.TC.Egress}, plane: plane}
}

// apply hands the node the whole desired state, as a sync does.
func (n *maglevNode) apply(sps ...*dataplane.ServicePort) {
	n.t.Helper()
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for _, sp := range sps {
		all[sp.Name] = sp
	}
	if err := n.plane.Reconcile(all); err != nil {
		n.t.Fatal(err)
	}
}

// pick is the backend the node sends a new flow from client:port to.
func (n *maglevNode) pick(client netip.Addr, port uint16, fe netip.AddrPort) netip.Addr {
	n.t.Helper()
	ret, got := n.in(flow{src: ap(client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "S"})
	if ret != actUnspec {
		n.t.Fatalf("flow from port %d: verdict %d, want it translated and passed on", port, int32(ret))
	}
	return got.dst.Addr()
}

var maglevLB = netip.MustParseAddr("192.0.2.80")

// lbService is a LoadBalancer IP (and a ClusterIP, which gets no table)
// with the given backends, in the order given.
func lbService(name string, affinity time.Duration, backends ...netip.Addr) *dataplane.ServicePort {
	sp := &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "default", Name: name, Protocol: dataplane.TCP},
		AffinityTimeout: affinity}
	var bs []dataplane.Backend
	for _, b := range backends {
		bs = append(bs, dataplane.Backend{Addr: b, Port: 8080})
	}
	sp.Frontends = []dataplane.Frontend{
		{Addr: netip.MustParseAddr("10.96.0.80"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP, Backends: bs},
		{Addr: maglevLB, Port: 80, Protocol: dataplane.TCP, Kind: dataplane.LoadBalancer, Backends: bs},
	}
	return sp
}

func maglevBackends(n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{10, 244, byte(i / 100), byte(10 + i%100)})
	}
	return out
}

func reversed(in []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, len(in))
	for i, a := range in {
		out[len(in)-1-i] = a
	}
	return out
}

const maglevFlows = 2000

// Two nodes that list the same backends in other orders, and number them
// differently, pick the same backend for every flow.
func TestMaglevNodesPickTheSameBackend(t *testing.T) {
	a, b := newMaglevNode(t, maglev.DefaultTableSize), newMaglevNode(t, maglev.DefaultTableSize)
	backends := maglevBackends(10)
	a.apply(lbService("web", 0, backends...))
	// Node b has seen another Service first, so its backend and
	// reverse-NAT ids are not a's.
	b.apply(lbService("other", 0, maglevBackends(30)[20:]...))
	b.apply(lbService("other", 0, maglevBackends(30)[20:]...), lbService("web", 0, reversed(backends)...))

	fe := ap(maglevLB, 80)
	client := netip.MustParseAddr("198.51.100.7")
	spread := map[netip.Addr]int{}
	differ := 0
	for port := uint16(20000); port < 20000+maglevFlows; port++ {
		pa, pb := a.pick(client, port, fe), b.pick(client, port, fe)
		if pa != pb {
			differ++
		}
		spread[pa]++
	}
	if differ > 0 {
		t.Errorf("%d of %d flows went to another backend on node b than on node a", differ, maglevFlows)
	}
	if len(spread) != len(backends) {
		t.Errorf("flows reached %d of %d backends: %v", len(spread), len(backends), spread)
	}
}

// Removing one of 10 backends moves the flows it had and few others: at
// most 15 % of all flows pick another backend than before.
func TestMaglevRemovingABackendMovesFewFlows(t *testing.T) {
	n := newMaglevNode(t, maglev.DefaultTableSize)
	backends := maglevBackends(10)
	n.apply(lbService("web", 0, backends...))
	fe := ap(maglevLB, 80)
	client := netip.MustParseAddr("198.51.100.7")
	before := make([]netip.Addr, maglevFlows)
	for i := range before {
		before[i] = n.pick(client, uint16(20000+i), fe)
	}

	gone := backends[3]
	n.apply(lbService("web", 0, append(append([]netip.Addr(nil), backends[:3]...), backends[4:]...)...))
	n.flushConntrack() // the same client ports as new flows
	moved, onGone := 0, 0
	for i := range before {
		after := n.pick(client, uint16(20000+i), fe)
		if after == gone {
			t.Fatalf("flow from port %d went to the removed backend %s", 20000+i, gone)
		}
		if before[i] == gone {
			onGone++
		}
		if after != before[i] {
			moved++
		}
	}
	if onGone == 0 {
		t.Fatal("no flow had the removed backend: the test shows nothing")
	}
	if frac := float64(moved) / maglevFlows; frac > 0.15 {
		t.Errorf("removing 1 of 10 backends moved %d of %d flows (%.1f%%; %d had the removed backend), want at most 15%%",
			moved, maglevFlows, 100*frac, onGone)
	}
}

// ClientIP affinity still wins: every flow of a client goes where its
// first one went, though Maglev alone would spread them.
func TestMaglevLeavesClientIPAffinityFirst(t *testing.T) {
	n := newMaglevNode(t, maglev.DefaultTableSize)
	n.apply(lbService("web", time.Minute, maglevBackends(10)...))
	fe := ap(maglevLB, 80)
	client := netip.MustParseAddr("198.51.100.7")
	first := n.pick(client, 20000, fe)
	for port := uint16(20001); port < 20050; port++ {
		if got := n.pick(client, port, fe); got != first {
			t.Fatalf("flow from port %d went to %s, the client's first flow to %s", port, got, first)
		}
	}
}

// `kpr run --lb-algorithm random` after a kpr with maglev: the tables
// are removed, and new flows no longer follow them.
func TestMaglevTablesRemovedForRandom(t *testing.T) {
	n := newMaglevNode(t, maglev.DefaultTableSize)
	n.apply(lbService("web", 0, maglevBackends(10)...))
	tables, err := maps.MaglevTables(n.lb, n.loaded.Maps.KprMaglev)
	if err != nil {
		t.Fatal(err)
	}
	// One table, for the LoadBalancer IP: a ClusterIP is never reached
	// from outside.
	if len(tables) != 1 || tables[0].Addr != maglevLB || len(tables[0].Shares) != 10 || tables[0].Size != maglev.DefaultTableSize {
		t.Fatalf("tables = %+v, want one of %d slots over 10 backends for %s", tables, maglev.DefaultTableSize, maglevLB)
	}
	// kpr dump reads the same from the pins, beside the running kpr.
	pinned, err := loader.OpenPinnedMaps(n.loaded.BPFRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	ro, err := maps.OpenReadOnly(pinned)
	if err != nil {
		t.Fatal(err)
	}
	if dumped, err := maps.MaglevTables(ro, pinned.KprMaglev); err != nil || len(dumped) != 1 || len(dumped[0].Shares) != 10 ||
		!dumped[0].Shares[0].Backend.IsValid() {
		t.Fatalf("tables read from the pins = %+v (%v), want the one table with its 10 backends", dumped, err)
	}
	removed, err := maps.RemoveMaglevTables(n.loaded.Maps.KprMaglev)
	if err != nil || removed != 1 {
		t.Fatalf("removed %d tables (%v), want 1", removed, err)
	}
	var k [8]byte
	var v uint32
	if n.loaded.Maps.KprMaglev.Iterate().Next(&k, &v) {
		t.Error("a Maglev table is left")
	}
}

// The frontends of one backend set share one table, and a restarted kpr
// replaces the tables with the same ones and removes those of frontends
// gone meanwhile.
func TestMaglevTablesSharedAndAdoptedAfterRestart(t *testing.T) {
	n := newMaglevNode(t, 1021)
	sp := lbService("web", 0, maglevBackends(10)...)
	for _, addr := range []string{"192.168.1.1", "192.168.1.2"} {
		sp.Frontends = append(sp.Frontends, dataplane.Frontend{Addr: netip.MustParseAddr(addr), Port: 30080,
			Protocol: dataplane.TCP, Kind: dataplane.NodePort, Backends: sp.Frontends[0].Backends})
	}
	n.apply(sp)
	inner := func() map[uint32]int {
		ids := map[uint32]int{}
		var k [8]byte
		var id uint32
		for it := n.loaded.Maps.KprMaglev.Iterate(); it.Next(&k, &id); {
			ids[id]++
		}
		return ids
	}
	if ids := inner(); len(ids) != 1 || sum(ids) != 3 {
		t.Fatalf("tables %v: want the LoadBalancer IP and both NodePorts on one table", ids)
	}
	fe := ap(maglevLB, 80)
	client := netip.MustParseAddr("198.51.100.7")
	before := make([]netip.Addr, 200)
	for i := range before {
		before[i] = n.pick(client, uint16(20000+i), fe)
	}

	// kpr restarts: a new LB, Maglev and Plane over the pinned maps, and
	// the Service lost its second NodePort address while kpr was down.
	lb, err := maps.New(n.loaded.Maps)
	if err != nil {
		t.Fatal(err)
	}
	mg, err := maps.NewMaglev(lb, n.loaded.Maps.KprMaglev, 1021, testClusterSeed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mg.Close() })
	n.lb, n.plane = lb, ebpfplane.New(lb, nil)
	n.plane.SetMaglev(mg)
	sp2 := *sp
	sp2.Frontends = sp.Frontends[:3]
	n.apply(&sp2)
	if ids := inner(); len(ids) != 1 || sum(ids) != 2 {
		t.Fatalf("tables %v after the restart: want the LoadBalancer IP and one NodePort on one table", ids)
	}
	n.flushConntrack()
	for i := range before {
		if got := n.pick(client, uint16(20000+i), fe); got != before[i] {
			t.Fatalf("after the restart, the flow from port %d went to %s, before to %s", 20000+i, got, before[i])
		}
	}
}

func sum(m map[uint32]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
