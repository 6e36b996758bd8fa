package tcnat

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
)

// The addresses of the BPF_PROG_TEST_RUN tests: a client outside, a node
// address carrying NodePorts, and pods.
type addrs struct {
	name             string
	client, node     netip.Addr
	pod1, pod2       netip.Addr
	clusterIP, extIP netip.Addr
}

var families = []addrs{
	{"IPv4", netip.MustParseAddr("192.168.100.2"), netip.MustParseAddr("192.168.100.10"),
		netip.MustParseAddr("10.244.0.2"), netip.MustParseAddr("10.244.0.3"),
		netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("203.0.113.7")},
	{"IPv6", netip.MustParseAddr("fd00:100::2"), netip.MustParseAddr("fd00:100::10"),
		netip.MustParseAddr("fd00:244::2"), netip.MustParseAddr("fd00:244::3"),
		netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("2001:db8::7")},
}

var protos = []dataplane.Protocol{dataplane.TCP, dataplane.UDP}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// A packet from outside to a NodePort leaves ingress addressed to the
// backend, with both checksums valid and the payload intact; the backend's
// reply leaves egress from the NodePort, so the client sees the address it
// talked to.
func TestNodePortTranslatedAndReplyRestored(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	for _, fam := range families {
		for _, proto := range protos {
			t.Run(fam.name+"/"+proto.String(), func(t *testing.T) {
				p.t = t
				fe, be := ap(fam.node, 30080), ap(fam.pod1, 8080)
				p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, proto, be)
				req := flow{src: ap(fam.client, 40001), dst: fe, proto: proto, tcpFlags: "S"}

				ret, got := p.in(req)
				if ret != actUnspec {
					t.Fatalf("ingress verdict %d, want %d (pass on)", int32(ret), -1)
				}
				if got.src != req.src || got.dst != be || got.proto != proto {
					t.Errorf("ingress rewrote %s to %s->%s, want %s->%s", req, got.src, got.dst, req.src, be)
				}
				samePayload(t, got.payload)

				reply := flow{src: be, dst: req.src, proto: proto, tcpFlags: "SA"}
				ret, back := p.out(reply)
				if ret != actUnspec {
					t.Fatalf("egress verdict %d", int32(ret))
				}
				if back.src != fe || back.dst != req.src {
					t.Errorf("egress rewrote reply %s to %s->%s, want %s->%s", reply, back.src, back.dst, fe, req.src)
				}
				samePayload(t, back.payload)

				// A later packet of the flow takes the same path.
				req.tcpFlags = "A"
				if _, got := p.in(req); got.dst != be {
					t.Errorf("second packet went to %s, want %s", got.dst, be)
				}
			})
		}
	}
	s := p.stats()
	if n := uint64(len(families) * len(protos)); s.NewFlows != n || s.Translated != 2*n || s.Reversed != n {
		t.Errorf("counters %+v, want %d new flows, %d translated, %d reversed", s, n, 2*n, n)
	}
}

// ExternalIPs and LoadBalancer IPs are served as NodePorts are; the
// external scope (externalTrafficPolicy: Local) wins over the internal one.
func TestExternalScopeServesTrafficFromOutside(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			p.t = t
			fe := ap(fam.extIP, 80)
			local, remote := ap(fam.pod1, 8080), ap(fam.pod2, 8080)
			for _, kind := range []dataplane.FrontendKind{dataplane.ExternalIP, dataplane.LoadBalancer} {
				p.upsert(kind, maps.ScopeInternal, fe, dataplane.TCP, remote)
				p.upsert(kind, maps.ScopeExternal, fe, dataplane.TCP, local)
				for port := uint16(41000); port < 41016; port++ {
					req := flow{src: ap(fam.client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}
					if _, got := p.in(req); got.dst != local {
						t.Fatalf("%s: %s went to %s, want the external scope's %s", kind, req, got.dst, local)
					}
				}
				p.flushConntrack()
			}
		})
	}
}

// A ClusterIP is not a Service for traffic from outside, and neither is a
// port of the node that no frontend names: both pass unchanged, without a
// conntrack entry.
func TestClusterIPAndNodeTrafficFromOutsideUntouched(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			p.t = t
			p.upsert(dataplane.ClusterIP, maps.ScopeInternal, ap(fam.clusterIP, 80), dataplane.TCP, ap(fam.pod1, 8080))
			for _, req := range []flow{
				{src: ap(fam.client, 40002), dst: ap(fam.clusterIP, 80), proto: dataplane.TCP, tcpFlags: "S"},
				{src: ap(fam.client, 40003), dst: ap(fam.node, 22), proto: dataplane.TCP, tcpFlags: "S"},
			} {
				frame := build(t, req)
				ret, out := run(t, p.ingress, frame)
				if ret != actUnspec || string(out) != string(frame) {
					t.Errorf("%s: verdict %d, packet changed %v; want it passed on untouched", req, int32(ret), string(out) != string(frame))
				}
				if _, ok := p.forwardEntry(req); ok {
					t.Errorf("%s: has a conntrack entry", req)
				}
			}
		})
	}
	if s := p.stats(); s.ClusterIpOutside != uint64(len(families)) || s.Translated != 0 {
		t.Errorf("counters %+v, want %d ClusterIPs from outside and nothing translated", s, len(families))
	}
}

// Every packet of a flow goes to the backend its first packet picked, even
// when the Service's slots are reordered so that a fresh pick would land
// elsewhere; it is conntrack that keeps it there.
func TestConntrackKeepsAFlowOnItsBackend(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[0]
	fe := ap(fam.node, 30081)
	var backends []netip.AddrPort
	for i := 0; i < 4; i++ {
		backends = append(backends, ap(netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)}), 8080))
	}
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, backends...)
	first := map[uint16]netip.AddrPort{}
	used := map[netip.AddrPort]bool{}
	for port := uint16(42000); port < 42032; port++ {
		_, got := p.in(flow{src: ap(fam.client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "S"})
		first[port] = got.dst
		used[got.dst] = true
	}
	if len(used) < 2 {
		t.Fatalf("32 flows all went to %v: the pick does not spread", used)
	}
	reversed := []netip.AddrPort{backends[3], backends[2], backends[1], backends[0]}
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, reversed...)
	for port, want := range first {
		if _, got := p.in(flow{src: ap(fam.client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "A"}); got.dst != want {
			t.Errorf("flow from port %d moved from %s to %s after the slots were reordered", port, want, got.dst)
		}
	}
	// Without its entries, the same flows are picked afresh over the new
	// order: some land elsewhere, which shows what kept them above.
	p.flushConntrack()
	moved := 0
	for port, was := range first {
		if _, got := p.in(flow{src: ap(fam.client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}); got.dst != was {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("no flow moved once conntrack was flushed: the test cannot tell conntrack from the pick")
	}
}

// A flow whose backend left the Service moves to a live backend with its
// next packet a second later, and its reply is restored from the new
// backend.
func TestFlowOfRemovedBackendMovesToALiveOne(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			p.t = t
			fe := ap(fam.node, 30082)
			b1, b2 := ap(fam.pod1, 5353), ap(fam.pod2, 5353)
			p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, b1, b2)
			// A flow on each backend.
			var onB1 flow
			for port := uint16(43000); ; port++ {
				f := flow{src: ap(fam.client, port), dst: fe, proto: dataplane.UDP}
				if _, got := p.in(f); got.dst == b1 {
					onB1 = f
					break
				}
				if port > 43100 {
					t.Fatal("no flow of 100 went to the first backend")
				}
			}
			p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, b2)
			// A flow's backend is checked once a second, not per packet.
			time.Sleep(1100 * time.Millisecond)
			if _, got := p.in(onB1); got.dst != b2 {
				t.Fatalf("after its backend left, %s went to %s, want %s", onB1, got.dst, b2)
			}
			if _, back := p.out(flow{src: b2, dst: onB1.src, proto: dataplane.UDP}); back.src != fe {
				t.Errorf("reply from the new backend leaves from %s, want %s", back.src, fe)
			}
		})
	}
}

// A frontend without a backend for traffic from outside (the external
// scope of externalTrafficPolicy: Local on a node without local endpoints)
// drops it, and counts the drop.
func TestFrontendWithoutBackendDrops(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[0]
	fe := ap(fam.node, 30083)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, ap(fam.pod1, 8080))
	p.upsert(dataplane.NodePort, maps.ScopeExternal, fe, dataplane.TCP)
	ret, _ := run(t, p.ingress, build(t, flow{src: ap(fam.client, 40004), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}))
	if ret != actShot {
		t.Errorf("verdict %d, want %d (dropped)", int32(ret), actShot)
	}
	if s := p.stats(); s.DropNoBackend != 1 {
		t.Errorf("counters %+v, want one drop for no backend", s)
	}
}

// TCP lifetimes follow the flags: a SYN gets the handshake lifetime, and
// keeps it through the backend's SYN-ACK and the client's ACK; the flow is
// established only once a segment without SYN has come from each side (the
// backend's first ACK or data). A FIN gives it the closing time, a RST
// shortens it; a SYN on the ports of a reset connection opens a new one.
// UDP gets its timeout. The lifetimes are the loader's.
func TestConntrackLifetimes(t *testing.T) {
	timeouts := loader.ConntrackTimeouts{TCPSyn: 11 * time.Second, TCPEstablished: 1000 * time.Second,
		TCPFin: 13 * time.Second, TCPRst: 3 * time.Second, UDP: 17 * time.Second, UDPStream: 19 * time.Second}
	p := newProgs(t, timeouts)
	fam := families[0]
	fe := ap(fam.node, 30084)
	be := ap(fam.pod1, 8080)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, be)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, be)

	expect := func(f flow, want time.Duration) {
		t.Helper()
		v, ok := p.forwardEntry(f)
		if !ok {
			t.Fatalf("%s: no conntrack entry", f)
		}
		left := time.Duration(v.ExpiresNs - monotonicNow(t))
		if left > want || left < want-2*time.Second {
			t.Errorf("%s: entry expires in %s, want %s", f, left, want)
		}
	}
	tcp := flow{src: ap(fam.client, 40005), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}
	p.in(tcp)
	expect(tcp, timeouts.TCPSyn)
	p.out(flow{src: be, dst: tcp.src, proto: dataplane.TCP, tcpFlags: "SA"})
	expect(tcp, timeouts.TCPSyn)
	tcp.tcpFlags = "A"
	p.in(tcp)
	expect(tcp, timeouts.TCPSyn)
	p.out(flow{src: be, dst: tcp.src, proto: dataplane.TCP, tcpFlags: "A"})
	expect(tcp, timeouts.TCPEstablished)
	tcp.tcpFlags = "AF"
	p.in(tcp)
	expect(tcp, timeouts.TCPFin)
	// At the number the client acknowledged (every ACK here carries
	// 2000): in its window, so it counts (window_test.go has the rest).
	p.out(flow{src: be, dst: tcp.src, proto: dataplane.TCP, tcpFlags: "R", seq: 2000})
	expect(tcp, timeouts.TCPRst)

	tcp.tcpFlags = "S"
	p.in(tcp)
	expect(tcp, timeouts.TCPSyn)
	if s := p.stats(); s.NewFlows != 2 {
		t.Errorf("new flows %d, want 2: a SYN after a RST opens a new connection", s.NewFlows)
	}
	p.out(flow{src: be, dst: tcp.src, proto: dataplane.TCP, tcpFlags: "SA"})
	tcp.tcpFlags = "A"
	p.in(tcp)
	p.out(flow{src: be, dst: tcp.src, proto: dataplane.TCP, tcpFlags: "A"})
	expect(tcp, timeouts.TCPEstablished)

	// Segments without SYN from the backend alone do not establish it.
	half := flow{src: ap(fam.client, 40009), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}
	p.in(half)
	p.out(flow{src: be, dst: half.src, proto: dataplane.TCP, tcpFlags: "SA"})
	p.out(flow{src: be, dst: half.src, proto: dataplane.TCP, tcpFlags: "A"})
	expect(half, timeouts.TCPSyn)

	udp := flow{src: ap(fam.client, 40006), dst: fe, proto: dataplane.UDP}
	p.in(udp)
	expect(udp, timeouts.UDP)
	p.out(flow{src: be, dst: udp.src, proto: dataplane.UDP})
	expect(udp, timeouts.UDPStream)
}

func TestConntrackTimeoutsAreValidated(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	p.loaded.TC.Close()
	p.loaded.TC = nil
	for _, bad := range []loader.ConntrackTimeouts{{UDP: 500 * time.Millisecond}, {TCPFin: -time.Second}} {
		if _, err := p.loaded.LoadTC(loader.TCOptions{Timeouts: bad}, nil); err == nil {
			t.Errorf("timeouts %+v accepted", bad)
		}
	}
}

// A conntrack map that refuses inserts (a plain hash map with room for one
// entry stands in for one that is full) drops only the new flow to a
// frontend, counted, and leaves no half-made entry; traffic to the node
// itself passes untouched.
func TestFailedConntrackInsertDropsOnlyTheNewFlow(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[0]
	fe := ap(fam.node, 30085)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, ap(fam.pod1, 8080))

	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	// New flows' entries go to kpr_ct_new (bpf/ct.h).
	ct := spec.Maps[bpf.TcNodeportMapKprCtNew]
	ct.Type, ct.MaxEntries, ct.Pinning = ebpf.Hash, 1, ebpf.PinNone
	ct.Flags &^= unix.BPF_F_NO_COMMON_LRU // an LRU map's flag
	// Every other pinned map is the loaded dataplane's, found by the
	// name in KprMaps' struct tags.
	replacements := map[string]*ebpf.Map{}
	loadedMaps := reflect.ValueOf(p.loaded.Maps).Elem()
	for i := 0; i < loadedMaps.NumField(); i++ {
		name := loadedMaps.Type().Field(i).Tag.Get("ebpf")
		if ms := spec.Maps[name]; ms != nil && ms.Pinning == ebpf.PinByName {
			m := loadedMaps.Field(i).Interface().(*ebpf.Map)
			ms.MaxEntries = m.MaxEntries() // as the loader sized it
			replacements[name] = m
		}
	}
	var objs struct {
		Ingress   *ebpf.Program `ebpf:"kpr_tc_ingress"`
		Conntrack *ebpf.Map     `ebpf:"kpr_ct_new"`
	}
	err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: replacements})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Ingress.Close()
	defer objs.Conntrack.Close()

	if ret, _ := run(t, objs.Ingress, build(t, flow{src: ap(fam.client, 40007), dst: fe, proto: dataplane.TCP, tcpFlags: "S"})); ret != actShot {
		t.Errorf("new flow with a full conntrack map: verdict %d, want %d (dropped)", int32(ret), actShot)
	}
	if s := p.stats(); s.DropCtInsert != 1 || s.Translated != 0 {
		t.Errorf("counters %+v, want one failed insert and nothing translated", s)
	}
	var k bpf.KprCtKey
	var v bpf.KprCtValue
	if objs.Conntrack.Iterate().Next(&k, &v) {
		t.Errorf("a half-made entry stayed behind: %+v", k)
	}
	toNode := build(t, flow{src: ap(fam.client, 40008), dst: ap(fam.node, 22), proto: dataplane.TCP, tcpFlags: "S"})
	if ret, out := run(t, objs.Ingress, toNode); ret != actUnspec || string(out) != string(toNode) {
		t.Errorf("traffic to the node itself: verdict %d, changed %v; want it passed on untouched", int32(ret), string(out) != string(toNode))
	}
}

// ClientIP affinity from outside: new flows of one client address go to the
// backend its first flow got, until the timeout; other clients spread.
func TestClientIPAffinity(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[0]
	fe := ap(fam.node, 30087)
	svc := maps.Service{VIPKey: maps.VIPKey{VIP: maps.VIP{Addr: fe.Addr(), Port: fe.Port(), Proto: dataplane.TCP}},
		Kind: dataplane.NodePort, AffinityTimeout: 60}
	for i := 0; i < 4; i++ {
		svc.Backends = append(svc.Backends, dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(20 + i)}), Port: 8080})
	}
	if err := p.lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	clients := map[netip.AddrPort]bool{}
	for c := byte(1); c <= 8; c++ {
		client := netip.AddrFrom4([4]byte{198, 51, 100, c})
		var first netip.AddrPort
		for port := uint16(44000); port < 44008; port++ {
			_, got := p.in(flow{src: ap(client, port), dst: fe, proto: dataplane.TCP, tcpFlags: "S"})
			if !first.IsValid() {
				first = got.dst
			} else if got.dst != first {
				t.Errorf("client %s: flow from port %d went to %s, its first flow to %s", client, port, got.dst, first)
			}
		}
		clients[first] = true
	}
	if len(clients) < 2 {
		t.Errorf("8 clients all stuck to %v: the first pick does not spread", clients)
	}
	if s := p.stats(); s.AffinityHit != 8*7 {
		t.Errorf("affinity hits %d, want %d", s.AffinityHit, 8*7)
	}
}
