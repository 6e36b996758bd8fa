package tcnat

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
	"github.com/kpr-io/kpr/tests/harness"
)

// The lifetimes kpr compiles in (bpf/ct.h), which these tests load with.
const (
	handshakeLifetime   = 60 * time.Second
	establishedLifetime = 24 * time.Hour
)

// A SYN that the backend answers with a SYN-ACK, and that nothing follows,
// as a spoofed SYN's, keeps its entries, and the SNAT port its reply entry
// holds, for the handshake lifetime only, not the established one. A
// client that completes its handshake, and whose backend then speaks, is
// established. A remote backend, so that the flow is SNATed; both families.
func TestHalfOpenFlowGetsTheHandshakeLifetime(t *testing.T) {
	l := newLAN(t, loader.TCOptions{})
	raw := newRawTCP(t, l.client.NetNS)
	for i, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30093)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

			syn := tcpFlow(netip.AddrPortFrom(spoofed(fam.v6, 7), uint16(40100+i)), fe, "S")
			raw.send(t, syn)
			f, ok := l.flowOf(syn.src, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Replied })
			if !ok {
				t.Fatalf("no flow from %s shows the backend's SYN-ACK within 3s (last seen: %+v, counters %+v)", syn.src, f, l.stats())
			}
			if !f.SNAT.IsValid() {
				t.Fatalf("flow %+v is not SNATed: the test wants a remote backend", f)
			}
			if f.Established || f.ExpiresIn > handshakeLifetime {
				t.Errorf("a SYN answered by a SYN-ACK alone: established %v, expires in %s; want the handshake lifetime (%s)",
					f.Established, f.ExpiresIn, handshakeLifetime)
			}
			if left, ok := l.replyExpiresIn(f); !ok || left > handshakeLifetime {
				t.Errorf("its reply entry (SNAT port %s) expires in %s (found %v); want within %s", f.SNAT, left, ok, handshakeLifetime)
			}

			// A real client: the kernel completes the handshake, and the
			// backend's greeting is its first segment without SYN.
			c, err := harness.DialTCP(l.client.NetNS, fe, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, l.remote.Name) {
				t.Fatalf("greeting %q, %v", line, err)
			}
			client := c.LocalAddr().(*net.TCPAddr).AddrPort()
			client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
			f, ok = l.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Established })
			if !ok {
				t.Fatalf("the completed connection from %s is not established: %+v", client, f)
			}
			if f.ExpiresIn < establishedLifetime-time.Minute {
				t.Errorf("established flow expires in %s, want %s", f.ExpiresIn, establishedLifetime)
			}
			if left, ok := l.replyExpiresIn(f); !ok || left < establishedLifetime-time.Minute {
				t.Errorf("its reply entry expires in %s (found %v), want %s", left, ok, establishedLifetime)
			}
		})
	}
}

// A flood of SYNs from spoofed sources, which the backend answers and
// nothing else does, holds every SNAT port to a remote backend; a
// legitimate client's new flow still gets through, on a port taken over
// from a flood flow, and the takeovers are counted. The range is 8 ports,
// so that 256 SYNs fill it many times over.
func TestSYNFloodLeavesSNATPortsForANewFlow(t *testing.T) {
	l := newLAN(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61007}})
	raw := newRawTCP(t, l.client.NetNS)
	fe := netip.AddrPortFrom(nodeAddr(false), 30094)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

	const flood = 256
	for i := 0; i < flood; i++ {
		raw.send(t, flow{src: netip.AddrPortFrom(spoofed(false, i), uint16(20000+i)), dst: fe, proto: dataplane.TCP,
			tcpFlags: "S", seq: uint32(i+1) * 7919, empty: true})
	}
	// The backend answers the flows that hold the ports.
	deadline := time.Now().Add(3 * time.Second)
	for {
		replied := 0
		for _, f := range l.flows() {
			if f.Frontend == fe && f.Replied {
				replied++
			}
		}
		if replied >= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d spoofed SYNs, %d flows show the backend's SYN-ACK within 3s; want all 8 ports' holders", flood, replied)
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	who, err := harness.WhoTCP(l.client.NetNS, fe, 10*time.Second)
	if err != nil || who != l.remote.Name {
		t.Fatalf("a new flow after the flood: %q, %v; want the remote backend %s (counters %+v)", who, err, l.remote.Name, l.stats())
	}
	t.Logf("the new flow got through in %s", time.Since(start).Round(time.Millisecond))
	if s := l.stats(); s.SnatTakeover == 0 {
		t.Errorf("counters %+v: no SNAT port was taken over", s)
	}
}

// Only a plain SYN opens a TCP flow: SYN|RST, SYN|FIN and SYN|ACK to a
// frontend, of no flow kpr knows, open none; they are dropped and
// counted. A SYN from the same port then opens its flow.
func TestOddSYNsOpenNoFlow(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	raw := newRawTCP(t, top.client.NetNS)
	odd := []string{"SR", "SF", "SA"}
	for i, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30095)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
			client := clientAddrs[0].Addr()
			if fam.v6 {
				client = clientAddrs[1].Addr()
			}
			want := uint64((i + 1) * len(odd))
			for j, flags := range odd {
				raw.send(t, tcpFlow(netip.AddrPortFrom(client, uint16(41000+j)), fe, flags))
			}
			if !eventually(3*time.Second, func() bool { return top.stats().DropInvalidSyn >= want }) {
				t.Errorf("counters %+v: want %d SYNs with ACK, RST or FIN dropped", top.stats(), want)
			}
			for j, flags := range odd {
				src := netip.AddrPortFrom(client, uint16(41000+j))
				if f, ok := top.flowOf(src, 0, func(maps.ConntrackFlow) bool { return true }); ok {
					t.Errorf("SYN with flags %s from %s opened flow %+v", flags, src, f)
				}
			}
			// The same port's plain SYN is a new flow.
			src := netip.AddrPortFrom(client, 41000)
			raw.send(t, tcpFlow(src, fe, "S"))
			if f, ok := top.flowOf(src, 3*time.Second, func(maps.ConntrackFlow) bool { return true }); !ok {
				t.Errorf("a plain SYN from %s opened no flow (%+v)", src, f)
			}
		})
	}
}

// A segment other than a SYN, to a Maglev frontend, of no flow this node
// knows, still goes to its Maglev backend, but the entry it opens has the
// handshake lifetime until the backend answers: here it never does (the
// backend is an address nobody holds). A connection whose entries were
// lost goes on through its Maglev backend, and is established again once
// that backend answers.
func TestMaglevMidstreamEntryHasTheHandshakeLifetime(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	mg, err := maps.NewMaglev(top.lb, top.loaded.Maps.KprMaglev, maglev.DefaultTableSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mg.Close() })
	plane := ebpfplane.New(top.lb, nil)
	plane.SetMaglev(mg)
	silent := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.90"), 80)
	live := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.91"), 80)
	lbPort := func(name string, fe netip.AddrPort, be netip.AddrPort) *dataplane.ServicePort {
		bs := []dataplane.Backend{{Addr: be.Addr(), Port: be.Port()}}
		return &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "default", Name: name, Protocol: dataplane.TCP},
			Frontends: []dataplane.Frontend{{Addr: fe.Addr(), Port: fe.Port(), Protocol: dataplane.TCP, Kind: dataplane.LoadBalancer, Backends: bs}}}
	}
	nobody := netip.AddrPortFrom(netip.MustParseAddr("10.244.0.250"), echoPort)
	pod := netip.AddrPortFrom(top.pods[0].IPv4, echoPort)
	sps := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for _, sp := range []*dataplane.ServicePort{lbPort("silent", silent, nobody), lbPort("live", live, pod)} {
		sps[sp.Name] = sp
	}
	if err := plane.Reconcile(sps); err != nil {
		t.Fatal(err)
	}

	raw := newRawTCP(t, top.client.NetNS)
	src := netip.AddrPortFrom(clientAddrs[0].Addr(), 42000)
	raw.send(t, tcpFlow(src, silent, "A"))
	f, ok := top.flowOf(src, 3*time.Second, func(maps.ConntrackFlow) bool { return true })
	if !ok {
		t.Fatalf("an ACK to Maglev frontend %s opened no flow", silent)
	}
	if f.Backend != nobody || f.Established || f.ExpiresIn > handshakeLifetime {
		t.Errorf("mid-stream flow %+v: want it sent to %s with the handshake lifetime (%s), not established", f, nobody, handshakeLifetime)
	}

	// A live connection whose entries are lost, as when an ECMP router
	// moves it to this node.
	c, err := harness.DialTCP(top.client.NetNS, live, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	top.flushConntrack()
	if _, err := c.Write([]byte("after the move\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "after the move\n" {
		t.Fatalf("echo after the entries were lost: %q, %v", line, err)
	}
	f, ok = top.flowOf(netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), 3*time.Second,
		func(f maps.ConntrackFlow) bool { return f.Established })
	if !ok || f.ExpiresIn < establishedLifetime-time.Minute {
		t.Errorf("the connection's new entry %+v (found %v): want it established again once the backend answered", f, ok)
	}
}
