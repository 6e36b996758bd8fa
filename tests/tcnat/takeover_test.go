package tcnat

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// Which SNAT port a new flow takes over when every port it tries is held
// (bpf/nat.h, snat_store): never the port of a handshake that may still be
// in progress, a flow that is over before a half-open one, and its own
// earlier flow's port when a client opens its ports again.

// A SYN the backend answered less than a second ago, and nothing since, may
// be a client's handshake in progress: a new flow that finds its port the
// only one does not take it, and its SYN is dropped, counted. Its
// retransmit a second later finds the half-open flow idle long enough, and
// gets through on its port.
func TestSNATTakeoverSparesAHandshakeInProgress(t *testing.T) {
	l := newLAN(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61000}})
	raw := newRawTCP(t, l.client.NetNS)
	fe := netip.AddrPortFrom(nodeAddr(false), 30095)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

	src := netip.AddrPortFrom(spoofed(false, 7), 20007)
	raw.send(t, flow{src: src, dst: fe, proto: dataplane.TCP, tcpFlags: "S", seq: 4242, empty: true})
	if f, ok := l.flowOf(src, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Replied }); !ok {
		t.Fatalf("the spoofed SYN's flow shows no SYN-ACK within 3s: %+v", f)
	}
	before := l.stats()
	start := time.Now()
	who, err := harness.WhoTCP(l.client.NetNS, fe, 5*time.Second)
	took := time.Since(start)
	if err != nil || who != l.remote.Name {
		t.Fatalf("a new flow beside the half-open one: %q, %v; want the remote backend %s after its SYN retransmit (counters %+v)",
			who, err, l.remote.Name, l.stats())
	}
	after := l.stats()
	if after.DropSnatPorts == before.DropSnatPorts || took < 800*time.Millisecond {
		t.Errorf("the new flow got through in %s with %d SYNs dropped for want of a port: it took the port of a handshake "+
			"answered a moment before, which a real client would have lost", took.Round(time.Millisecond), after.DropSnatPorts-before.DropSnatPorts)
	}
	if after.SnatTakeover == before.SnatTakeover {
		t.Errorf("counters %+v: the retransmitted SYN got through without taking the half-open flow's port over", after)
	}
}

// A new flow that must take a port over takes that of a flow that is over
// (closed by a FIN from each side) rather than that of a flow that never
// completed its handshake, even though the closed one lives longer: the
// closed connection's ends are gone, and the half-open one may still be a
// slow client's, and its backend still holds it.
func TestSNATTakeoverPrefersAClosedFlow(t *testing.T) {
	l, raw, fe := afterAClosedRequest(t, [2]uint16{61000, 61001}, 30096)
	src := netip.AddrPortFrom(spoofed(false, 8), 20008)
	raw.send(t, flow{src: src, dst: fe, proto: dataplane.TCP, tcpFlags: "S", seq: 4243, empty: true})
	halfOpen, ok := l.flowOf(src, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Replied })
	if !ok || !halfOpen.SNAT.IsValid() {
		t.Fatalf("the spoofed SYN's flow shows no SYN-ACK on a SNAT port within 3s: %+v", halfOpen)
	}
	// Idle long enough that its port may be taken over at all.
	time.Sleep(1200 * time.Millisecond)

	_, client := dialFrontend(t, l, fe)
	got, ok := l.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.SNAT.IsValid() })
	if !ok {
		t.Fatalf("the third flow has no SNATed entry: %+v", got)
	}
	if got.SNAT == halfOpen.SNAT {
		t.Errorf("the third flow took %s from the half-open flow; want the closed flow's port", got.SNAT)
	}
	if f, ok := l.flowOf(src, 0, func(f maps.ConntrackFlow) bool { return f.SNAT == halfOpen.SNAT }); !ok {
		t.Errorf("the half-open flow lost its port %s: %+v", halfOpen.SNAT, f)
	}
}

// A client that opens a connection again from the address and port of one
// it has just reset gets the same SNAT port, as netfilter reopens a closed
// tuple with its NAT mapping: the backend sees that connection again, not a
// port another flow may have left a half-open connection on.
func TestReopenedConnectionKeepsItsSNATPort(t *testing.T) {
	l := newLAN(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61007}})
	fe := netip.AddrPortFrom(nodeAddr(false), 30098)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

	local := netip.AddrPortFrom(clientAddr(false), 40123)
	var ports []netip.AddrPort
	for i := 0; i < 2; i++ {
		c := dialFrom(t, l.client.NetNS, local, fe)
		if greeting := readGreeting(t, c); !strings.HasPrefix(greeting, l.remote.Name) {
			t.Fatalf("connection %d: greeting %q", i, greeting)
		}
		// Closed with a reset, so that the client keeps no TIME_WAIT
		// and may connect from the same port at once.
		if err := c.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		c.Close()
		f, ok := l.flowOf(local, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Rst })
		if !ok || !f.SNAT.IsValid() {
			t.Fatalf("connection %d: no reset SNATed flow from %s: %+v", i, local, f)
		}
		ports = append(ports, f.SNAT)
	}
	if ports[0] != ports[1] {
		t.Errorf("the reopened connection left from %s, the first from %s; want the same SNAT port", ports[1], ports[0])
	}
}

// dialFrontend connects the client to fe, or fails the test; the
// connection is closed when the test ends. It returns the connection and
// the client's address and port.
func dialFrontend(t *testing.T, l *lan, fe netip.AddrPort) (net.Conn, netip.AddrPort) {
	t.Helper()
	c, err := harness.DialTCP(l.client.NetNS, fe, 3*time.Second)
	if err != nil {
		t.Fatalf("connect to %s: %v (counters %+v)", fe, err, l.stats())
	}
	t.Cleanup(func() { c.Close() })
	return c, netip.MustParseAddrPort(c.LocalAddr().String())
}

// establishedConn is a connection to fe that has read the remote pod's
// greeting and that kpr's conntrack shows established.
func establishedConn(t *testing.T, l *lan, fe netip.AddrPort) net.Conn {
	t.Helper()
	c, client := dialFrontend(t, l, fe)
	if greeting := readGreeting(t, c); !strings.HasPrefix(greeting, l.remote.Name) {
		t.Fatalf("greeting %q", greeting)
	}
	if f, ok := l.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Established }); !ok {
		t.Fatalf("the connection is not established in kpr's conntrack: %+v", f)
	}
	return c
}

// requestAndClose makes one request to fe and closes it from the client's
// side (the echo server closes on its EOF, so a FIN goes each way); it
// returns the client's address and port.
func requestAndClose(t *testing.T, l *lan, fe netip.AddrPort) netip.AddrPort {
	t.Helper()
	c, err := harness.DialTCP(l.client.NetNS, fe, 3*time.Second)
	if err != nil {
		t.Fatalf("request to %s: %v (counters %+v)", fe, err, l.stats())
	}
	defer c.Close()
	if greeting := readGreeting(t, c); !strings.HasPrefix(greeting, l.remote.Name) {
		t.Fatalf("request to %s: greeting %q", fe, greeting)
	}
	return netip.MustParseAddrPort(c.LocalAddr().String())
}

func readGreeting(t *testing.T, c net.Conn) string {
	t.Helper()
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read the greeting from %s: %v", c.RemoteAddr(), err)
	}
	return string(buf[:n])
}

// dialFrom connects to fe from local, inside ns, with SO_REUSEADDR so
// that the port can be bound again right after a reset.
func dialFrom(t *testing.T, ns *harness.NetNS, local, fe netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	err := harness.Do(ns, func() error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(local),
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
				})
				if err != nil {
					return err
				}
				return serr
			}}
		var err error
		c, err = d.Dial("tcp", fe.String())
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", fe, local, err)
	}
	return c
}

// A SYN flood, spoofed, many times larger than the conntrack maps, leaves
// an idle established connection alone once it has lived on past its
// handshake: the flood's half-open flows churn kpr_ct_new, and the
// connection's entries sit in kpr_conntrack, which the flood never writes.
// With one map for both, the flood's entries evicted the connection's, and
// its next segment was not translated.
func TestSYNFloodLeavesIdleEstablishedFlows(t *testing.T) {
	l := buildLAN(t, 1)
	l.loadKpr(t, loader.TCOptions{}, loader.MapSizes{Conntrack: 256, ConntrackNew: 256})
	raw := newRawTCP(t, l.client.NetNS)
	fe := netip.AddrPortFrom(nodeAddr(false), 30099)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

	c := longLivedConn(t, l, fe)

	const flood = 4096 // 16 times the entries of either map
	for i := 0; i < flood; i++ {
		raw.send(t, flow{src: netip.AddrPortFrom(spoofed(false, i), uint16(20000+i%40000)), dst: fe, proto: dataplane.TCP,
			tcpFlags: "S", seq: uint32(i+1) * 7919, empty: true})
	}
	if s := l.stats(); s.NewFlows < flood/2 {
		t.Fatalf("counters %+v: the flood opened %d flows, want most of its %d SYNs", s, s.NewFlows, flood)
	}

	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "ping\n" {
		t.Fatalf("after %d spoofed SYNs the idle connection echoes %q, %v; want ping (counters %+v)", flood, buf[:n], err, l.stats())
	}
}

// Connections that open, serve one request and close, many times more than
// the conntrack maps hold, leave an idle established connection that has
// lived on alone: a short flow never leaves kpr_ct_new, and a flow that is
// over moves back there for its closing time, as
// netfilter's full table drops closing connections first. With closed flows
// kept in kpr_conntrack, a client opening a connection per request evicted
// the idle connection's entries within seconds (at 6,000 requests a second
// and 120 s of closing time, 1.4 million entries want the 131,072 places).
//
// The maps are small, but not so small that the LRU evicts while they have
// room: each CPU keeps up to 128 free entries of its own, and before Linux
// 6.16 a CPU whose own list ran dry evicted 128 entries rather than wait
// for the others' (seen on 5.10 with 256 entries and two CPUs).
func TestClosedConnectionsLeaveIdleEstablishedFlows(t *testing.T) {
	ctSize := 256 * uint32(runtime.NumCPU()+1)
	l := buildLAN(t, 1)
	l.loadKpr(t, loader.TCOptions{}, loader.MapSizes{Conntrack: ctSize, ConntrackNew: ctSize})
	fe := netip.AddrPortFrom(nodeAddr(false), 30097)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

	c := longLivedConn(t, l, fe)

	closed := int(ctSize) // two entries each: twice either map
	for i := 0; i < closed; i++ {
		requestAndClose(t, l, fe)
	}

	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "ping\n" {
		t.Fatalf("after %d closed connections the idle connection echoes %q, %v; want ping (counters %+v)", closed, buf[:n], err, l.stats())
	}
}

// A takeover removes the forward entry of the flow whose port it takes, and
// no other: when the backends changed between two connections from the
// same client address and port, the second may hold the same SNAT port
// toward its own backend under the same forward key, and a new flow that
// takes the first one's port must leave it alone.
func TestSNATTakeoverSparesTheClientsNextConnection(t *testing.T) {
	l := buildLAN(t, 2)
	l.loadKpr(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61000}}, fixtureSizes)
	raw := newRawTCP(t, l.client.NetNS)
	fe := netip.AddrPortFrom(nodeAddr(false), 30094)
	first := netip.AddrPortFrom(l.remotes[0].IPv4, echoPort)
	second := netip.AddrPortFrom(l.remotes[1].IPv4, echoPort)
	local := netip.AddrPortFrom(clientAddr(false), 40125)

	// The first connection, to the first pod, reset by the client: its
	// port is free to take over.
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, first)
	c := dialFrom(t, l.client.NetNS, local, fe)
	if greeting := readGreeting(t, c); !strings.HasPrefix(greeting, l.remotes[0].Name) {
		t.Fatalf("first connection: greeting %q", greeting)
	}
	if err := c.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if f, ok := l.flowOf(local, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Rst }); !ok {
		t.Fatalf("the first connection is not reset in kpr's conntrack: %+v", f)
	}

	// The second, from the same port, to the second pod: the same SNAT
	// port, toward another backend.
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, second, first)
	var live net.Conn
	for i := 0; live == nil; i++ {
		c := dialFrom(t, l.client.NetNS, local, fe)
		greeting := readGreeting(t, c)
		if strings.HasPrefix(greeting, l.remotes[1].Name) {
			live = c
			break
		}
		// The flow hash sent it to the first pod again: reset, and
		// move the pods' order until the hash picks the second.
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
		if i == 8 {
			t.Fatalf("connections from %s never reach %s", local, l.remotes[1].Name)
		}
		l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, first, second)
	}
	defer live.Close()
	if f, ok := l.flowOf(local, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Established && f.Backend == second }); !ok {
		t.Fatalf("the second connection is not established to %s in kpr's conntrack: %+v", second, f)
	}

	// Spoofed SYNs until one is sent to the first pod and takes the reset
	// connection's port.
	before := l.stats()
	for i := 0; l.stats().SnatTakeover == before.SnatTakeover; i++ {
		if i == 64 {
			t.Fatalf("64 spoofed SYNs took no port over (counters %+v)", l.stats())
		}
		raw.send(t, flow{src: netip.AddrPortFrom(spoofed(false, 40+i), uint16(21000+i)), dst: fe, proto: dataplane.TCP,
			tcpFlags: "S", seq: uint32(i+1) * 104729, empty: true})
		time.Sleep(20 * time.Millisecond)
	}

	_ = live.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := live.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := live.Read(buf)
	if err != nil || string(buf[:n]) != "ping\n" {
		t.Fatalf("after a takeover of the earlier connection's port the second connection echoes %q, %v; want ping (counters %+v)", buf[:n], err, l.stats())
	}
}

// A flow whose client acknowledged the backend's SYN-ACK has completed the
// three-way handshake (netfilter's ESTABLISHED, which it assures), even
// while the backend has sent nothing since: a server that does not speak
// first, or one whose accept queue is full and drops that ACK for a while.
// Its client already uses the connection, so a new flow never takes its
// port over, however long it stays quiet; spoofed SYNs, which never
// acknowledge anything, find no port and are dropped. Taken over, the
// connection's next segment found no flow and the node reset it (the
// hostile benchmark's one failed request at 500 SYN/s).
func TestSNATTakeoverSparesACompletedHandshake(t *testing.T) {
	l := newLAN(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61000}})
	raw := newRawTCP(t, l.client.NetNS)
	const quietPort = 9099
	var ln net.Listener
	if err := harness.Do(l.remote.NetNS, func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", quietPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fe := netip.AddrPortFrom(nodeAddr(false), 30093)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), quietPort)...)

	c, client := dialFrontend(t, l, fe)
	if f, ok := l.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Replied }); !ok || f.Established {
		t.Fatalf("the connection's flow: %+v (found %v); want answered, not established (the backend has sent no segment of its own)", f, ok)
	}
	time.Sleep(1500 * time.Millisecond) // past the idle time a half-open flow keeps its port

	before := l.stats()
	for i := 0; i < 16; i++ {
		raw.send(t, flow{src: netip.AddrPortFrom(spoofed(false, i), uint16(20000+i)), dst: fe, proto: dataplane.TCP,
			tcpFlags: "S", seq: uint32(i+1) * 7919, empty: true})
	}
	after := l.stats()
	if after.SnatTakeover != before.SnatTakeover {
		t.Errorf("counters %+v: a spoofed SYN took the port of a connection whose handshake completed", after)
	}
	// The client speaks first; the backend must get it on the same
	// connection.
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 16)
	n, err := s.Read(buf)
	if err != nil || string(buf[:n]) != "hello\n" {
		t.Fatalf("the backend read %q, %v; want hello (counters %+v)", buf[:n], err, l.stats())
	}
	if _, err := s.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if n, err = c.Read(buf); err != nil || string(buf[:n]) != "hi\n" {
		t.Fatalf("the client read %q, %v; want hi (counters %+v)", buf[:n], err, l.stats())
	}
}

// A flow that has just closed keeps its port for a moment: the client's
// last ACK may still be on its way to the backend, whose connection would
// then drop a new SYN on the same ends, and that SYN's client would wait
// out a retransmission. A spoofed SYN right after the close finds the only
// port held and is dropped; one sent after the moment takes the port over.
func TestSNATTakeoverWaitsForAClosedFlowsLastPackets(t *testing.T) {
	l, raw, fe := afterAClosedRequest(t, [2]uint16{61000, 61000}, 30091)
	// The backend's FIN follows the client's within a millisecond or two
	// (the echo server closes on its EOF): then the flow is closed.
	time.Sleep(30 * time.Millisecond)
	verdict := func(i int) bool { return spoofedSYNTakesAPort(t, l, raw, fe, 60+i) }
	if verdict(0) {
		t.Errorf("a SYN right after a close took its port; want it dropped for want of a port")
	}
	time.Sleep(400 * time.Millisecond)
	if !verdict(1) {
		t.Errorf("a SYN 400 ms after the close did not take the closed flow's port")
	}
}

// spoofedSYNTakesAPort sends a spoofed SYN (source number i) to fe and
// reports whether the node took a SNAT port over for it (true) or dropped
// it for want of a port (false), as its counters show once it has been
// processed.
func spoofedSYNTakesAPort(t *testing.T, l *lan, raw *rawTCP, fe netip.AddrPort, i int) bool {
	t.Helper()
	before := l.stats()
	raw.send(t, flow{src: netip.AddrPortFrom(spoofed(false, i), uint16(22000+i)), dst: fe, proto: dataplane.TCP,
		tcpFlags: "S", seq: uint32(7000 + i), empty: true})
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s := l.stats()
		if s.SnatTakeover != before.SnatTakeover {
			return true
		}
		if s.DropSnatPorts != before.DropSnatPorts {
			return false
		}
	}
	t.Fatalf("spoofed SYN %d: neither taken over nor dropped within 1s (counters %+v)", i, l.stats())
	return false
}

// A port that another CPU is taking over at this moment (its claim in
// kpr_snat_claims) is not taken over again: with two CPUs taking one port,
// both new flows believed they had it and one lost its replies. The test
// plays the other CPU by writing its claim; without it, the same SYN takes
// the port, and no claim is left behind.
func TestSNATTakeoverLeavesAClaimedPort(t *testing.T) {
	l, raw, fe := afterAClosedRequest(t, [2]uint16{61000, 61000}, 30092)
	time.Sleep(400 * time.Millisecond) // the closed flow's port is reclaimable

	claims := l.loaded.Maps.KprSnatClaims
	key, ok := snatReplyKey(t, l, 61000)
	if !ok {
		t.Fatalf("no reply entry holds SNAT port 61000 after the closed request")
	}
	if err := claims.Update(&key, uint32(99), ebpf.UpdateNoExist); err != nil {
		t.Fatalf("write another CPU's claim: %v", err)
	}
	if spoofedSYNTakesAPort(t, l, raw, fe, 70) {
		t.Errorf("a SYN took over a port that another CPU had claimed")
	}
	if err := claims.Delete(&key); err != nil {
		t.Fatalf("delete the claim: %v (the program deleted a claim it did not make?)", err)
	}
	if !spoofedSYNTakesAPort(t, l, raw, fe, 71) {
		t.Errorf("a SYN did not take over the closed flow's port once no claim was on it")
	}
	var k bpf.KprCtKey
	var v uint32
	if it := claims.Iterate(); it.Next(&k, &v) {
		t.Errorf("a claim was left behind after the takeover: %+v by CPU %d", k, v)
	}
}

// snatReplyKey finds the reply entry that holds SNAT port port.
func snatReplyKey(t *testing.T, l *lan, port uint16) (bpf.KprCtKey, bool) {
	t.Helper()
	for _, m := range []*ebpf.Map{l.loaded.Maps.KprCtNew, l.loaded.Maps.KprConntrack} {
		var k bpf.KprCtKey
		var v bpf.KprCtValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			if k.Dir == 1 && k.Dport == htons(port) && v.Flags&ctFlagSNAT != 0 {
				return k, true
			}
		}
		if err := it.Err(); err != nil {
			t.Fatalf("read %s: %v", m, err)
		}
	}
	return bpf.KprCtKey{}, false
}

// afterAClosedRequest makes a LAN whose node SNATs to snatPorts, a NodePort
// nodePort with the remote backend, and one request to it that the client
// has closed, whose flow shows the FIN; it returns the LAN, a raw socket in
// the client's namespace and the frontend.
func afterAClosedRequest(t *testing.T, snatPorts [2]uint16, nodePort uint16) (*lan, *rawTCP, netip.AddrPort) {
	t.Helper()
	l := newLAN(t, loader.TCOptions{SNATPorts: snatPorts})
	raw := newRawTCP(t, l.client.NetNS)
	fe := netip.AddrPortFrom(nodeAddr(false), nodePort)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)
	closed := requestAndClose(t, l, fe)
	if f, ok := l.flowOf(closed, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Fin }); !ok {
		t.Fatalf("the closed request's flow shows no FIN within 3s: %+v", f)
	}
	return l, raw, fe
}
