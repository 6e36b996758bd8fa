package tcnat

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// The lifetime of a reset flow kpr compiles in (bpf/ct.h).
const resetLifetime = 10 * time.Second

// A RST or FIN with the client's address and port, sent from a raw socket
// with a sequence number outside the flow's window, is dropped and counted,
// and leaves a live connection's entries (and its SNAT port's) with the
// established lifetime; the connection keeps working. A RST at the number
// the client's own kernel would send next still ends the flow. To a backend
// on this node and on another (SNATed, where a RST with the backend's
// address to the SNAT port is tried too); both families.
func TestOutOfWindowRSTAndFINChangeNoLifetime(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		top := newTopology(t, 1, loader.TCAttachAuto)
		raw := newRawTCP(t, top.client.NetNS)
		for _, fam := range topoFamilies {
			t.Run(fam.name, func(t *testing.T) {
				fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30096)
				top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
				windowCheck(t, top.progs, raw, top.client.NetNS, fe)
			})
		}
	})
	t.Run("remote", func(t *testing.T) {
		l := newLAN(t, loader.TCOptions{})
		raw := newRawTCP(t, l.client.NetNS)
		for _, fam := range topoFamilies {
			t.Run(fam.name, func(t *testing.T) {
				fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30096)
				l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)
				windowCheck(t, l.progs, raw, l.client.NetNS, fe)
			})
		}
	})
}

// windowCheck opens a connection from ns to fe and sends the out-of-window
// segments, then the in-window RST, at its flow.
func windowCheck(t *testing.T, p *progs, raw *rawTCP, ns *harness.NetNS, fe netip.AddrPort) {
	t.Helper()
	c, err := harness.DialTCP(ns, fe, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	echo(t, c, r, "before\n")
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	f, ok := p.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Established })
	if !ok {
		t.Fatalf("the connection from %s is not established: %+v", client, f)
	}
	snd, rcv := tcpSeqs(t, c)

	before := p.stats().DropOutOfWindow
	spoofs := []flow{
		{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "R", seq: snd + 1<<31, empty: true},
		{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "RA", seq: snd - 1, ack: rcv, empty: true},
		{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "FA", seq: snd + 1<<31, ack: rcv, empty: true},
		{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "FA", seq: snd - 1<<30, ack: rcv, empty: true},
	}
	if f.SNAT.IsValid() {
		// The backend's side: its address and port, to the SNAT port.
		spoofs = append(spoofs, flow{src: f.Backend, dst: f.SNAT, proto: dataplane.TCP, tcpFlags: "R", seq: rcv + 1<<31, empty: true},
			flow{src: f.Backend, dst: f.SNAT, proto: dataplane.TCP, tcpFlags: "FA", seq: rcv + 1<<31, ack: snd, empty: true})
	}
	for _, s := range spoofs {
		raw.send(t, s)
	}
	want := before + uint64(len(spoofs))
	if !eventually(3*time.Second, func() bool { return p.stats().DropOutOfWindow >= want }) {
		t.Errorf("counters %+v: want %d RST and FIN outside the window dropped", p.stats(), len(spoofs))
	}
	f, _ = p.flowOf(client, 0, func(maps.ConntrackFlow) bool { return true })
	if f.Rst || f.Fin || !f.Established || f.ExpiresIn < establishedLifetime-time.Minute {
		t.Errorf("after RST and FIN outside the window the flow is %+v; want it established, %s to live", f, establishedLifetime)
	}
	if f.SNAT.IsValid() {
		if left, ok := p.replyExpiresIn(f); !ok || left < establishedLifetime-time.Minute {
			t.Errorf("its SNAT reply entry expires in %s (found %v), want %s", left, ok, establishedLifetime)
		}
	}
	echo(t, c, r, "after the spoofs\n")

	// The client's kernel's own next number is in the window.
	snd, _ = tcpSeqs(t, c)
	raw.send(t, flow{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "R", seq: snd, empty: true})
	f, ok = p.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Rst })
	if !ok || f.ExpiresIn > resetLifetime {
		t.Errorf("after a RST in the window the flow is %+v (reset %v); want the reset lifetime (%s)", f, ok, resetLifetime)
	}
	if f.SNAT.IsValid() {
		if left, ok := p.replyExpiresIn(f); !ok || left > resetLifetime {
			t.Errorf("its SNAT reply entry expires in %s (found %v), want within %s", left, ok, resetLifetime)
		}
	}
}

// echo sends line on c and fails unless it comes back on r.
func echo(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
	if got, err := r.ReadString('\n'); err != nil || got != line {
		t.Fatalf("echo of %q: %q, %v", line, got, err)
	}
}

// The queues TCP_REPAIR_QUEUE selects (linux/tcp.h).
const (
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// tcpSeqs reads, from c's socket, the next sequence number it sends and
// the next it expects: the connection as the client's kernel has it, not
// as kpr noted it. TCP_REPAIR (CAP_NET_ADMIN) lends the numbers; the
// connection is left as it was, without a window probe.
func tcpSeqs(t *testing.T, c net.Conn) (snd, rcv uint32) {
	t.Helper()
	sc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	err = sc.Control(func(fd uintptr) {
		s := int(fd)
		if serr = unix.SetsockoptInt(s, unix.SOL_TCP, unix.TCP_REPAIR, 1); serr != nil {
			serr = fmt.Errorf("TCP_REPAIR on: %w", serr)
			return
		}
		defer func() {
			if err := unix.SetsockoptInt(s, unix.SOL_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF_NO_WP); err != nil && serr == nil {
				serr = fmt.Errorf("TCP_REPAIR off: %w", err)
			}
		}()
		read := func(q int) uint32 {
			if serr != nil {
				return 0
			}
			if serr = unix.SetsockoptInt(s, unix.SOL_TCP, unix.TCP_REPAIR_QUEUE, q); serr != nil {
				return 0
			}
			v, err := unix.GetsockoptInt(s, unix.SOL_TCP, unix.TCP_QUEUE_SEQ)
			serr = err
			return uint32(v)
		}
		snd, rcv = read(tcpSendQueue), read(tcpRecvQueue)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		t.Fatalf("read the connection's sequence numbers: %v", err)
	}
	return snd, rcv
}

// A SYN with the address and port of a live flow's client, to another
// NodePort of the same Service (the same backend), does not take that
// flow's reply entry: without SNAT (a local backend) it is refused and
// counted, since the backend would see one connection; with SNAT (a
// remote backend) it gets its own port. Either way the live flow keeps
// working, its replies still from its own NodePort. Both families.
func TestSiblingNodePortSYNLeavesALiveFlow(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		top := newTopology(t, 1, loader.TCAttachAuto)
		raw := newRawTCP(t, top.client.NetNS)
		for _, fam := range topoFamilies {
			t.Run(fam.name, func(t *testing.T) {
				n1, n2 := netip.AddrPortFrom(nodeAddr(fam.v6), 30097), netip.AddrPortFrom(nodeAddr(fam.v6), 30098)
				for _, fe := range []netip.AddrPort{n1, n2} {
					top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
				}
				siblingCheck(t, top.progs, raw, top.client.NetNS, n1, n2)
			})
		}
	})
	t.Run("remote", func(t *testing.T) {
		l := newLAN(t, loader.TCOptions{})
		raw := newRawTCP(t, l.client.NetNS)
		for _, fam := range topoFamilies {
			t.Run(fam.name, func(t *testing.T) {
				n1, n2 := netip.AddrPortFrom(nodeAddr(fam.v6), 30097), netip.AddrPortFrom(nodeAddr(fam.v6), 30098)
				for _, fe := range []netip.AddrPort{n1, n2} {
					l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)
				}
				siblingCheck(t, l.progs, raw, l.client.NetNS, n1, n2)
			})
		}
	})
}

func siblingCheck(t *testing.T, p *progs, raw *rawTCP, ns *harness.NetNS, n1, n2 netip.AddrPort) {
	t.Helper()
	c, err := harness.DialTCP(ns, n1, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	a, ok := p.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Established && f.Frontend == n1 })
	if !ok {
		t.Fatalf("the connection from %s to %s is not established: %+v", client, n1, a)
	}

	before := p.stats()
	raw.send(t, flow{src: client, dst: n2, proto: dataplane.TCP, tcpFlags: "S", seq: 7919, empty: true})
	if a.SNAT.IsValid() {
		b, ok := p.flowOf(client, 3*time.Second, func(f maps.ConntrackFlow) bool { return f.Frontend == n2 })
		if !ok {
			t.Fatalf("the SYN from %s to %s opened no flow (counters %+v)", client, n2, p.stats())
		}
		if b.SNAT == a.SNAT {
			t.Errorf("the flow to %s got the SNAT port of the live flow to %s: %s", n2, n1, a.SNAT)
		}
	} else if !eventually(3*time.Second, func() bool { return p.stats().DropReplyTaken > before.DropReplyTaken }) {
		t.Errorf("counters %+v: the SYN from %s to %s was not refused", p.stats(), client, n2)
	}
	// Whatever the backend and the client's kernel make of the SYN's
	// consequences has happened by now: the live flow still echoes.
	time.Sleep(200 * time.Millisecond)
	echo(t, c, r, "still here\n")
	if f, _ := p.flowOf(client, 0, func(f maps.ConntrackFlow) bool { return f.Frontend == n1 }); f.Rst || !f.Established {
		t.Errorf("the live flow is now %+v; want it established", f)
	}
}
