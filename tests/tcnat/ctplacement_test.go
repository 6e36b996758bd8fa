package tcnat

import (
	"bufio"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
)

// A flow's entries stay in kpr_ct_new through a short life (bpf/ct.h, "Two
// maps"): a connection per request never pays the two moves, which cost
// the packet path a third of its BPF time. A connection that carries a
// packet a second after its handshake moves to kpr_conntrack, out of a
// flood's reach, and back to kpr_ct_new when it closes.
func TestFlowsMoveToTheLongLivedMapOnceTheyLiveOn(t *testing.T) {
	l := newLAN(t, loader.TCOptions{})
	fe := netip.AddrPortFrom(nodeAddr(false), 30093)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)

	c := establishedConn(t, l, fe)
	client := netip.MustParseAddrPort(c.LocalAddr().String())
	l.wantFlowIn(t, client, l.loaded.Maps.KprCtNew, "just after the handshake")

	l.liveOn(t, c)

	c.Close()
	l.wantFlowIn(t, client, l.loaded.Maps.KprCtNew, "once closed")

	short := requestAndClose(t, l, fe)
	l.wantFlowIn(t, short, l.loaded.Maps.KprCtNew, "a connection of one request")
}

// wantFlowIn waits up to 3 s for both entries of client's flow to be in
// m, and none in the other map.
func (l *lan) wantFlowIn(t *testing.T, client netip.AddrPort, m *ebpf.Map, when string) {
	t.Helper()
	other := l.loaded.Maps.KprConntrack
	if m == other {
		other = l.loaded.Maps.KprCtNew
	}
	var in, out int
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		in, out = flowEntries(t, m, client), flowEntries(t, other, client)
		if in == 2 && out == 0 || time.Now().After(deadline) {
			break
		}
	}
	if in != 2 || out != 0 {
		name, _ := m.Info()
		t.Fatalf("%s: %d of the entries of %s's flow are in %s, %d in the other map; want both in %s",
			when, in, client, name.Name, out, name.Name)
	}
}

// flowEntries counts the entries of client's flow in m: the forward entry
// from client, and the reply entry to it, or to the node address and port
// it was SNATed to.
func flowEntries(t *testing.T, m *ebpf.Map, client netip.AddrPort) int {
	t.Helper()
	a, port := addr16(client.Addr()), htons(client.Port())
	var k bpf.KprCtKey
	var v bpf.KprCtValue
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		switch {
		case k.Dir == 0 && k.Saddr == a && k.Sport == port:
			n++
		case k.Dir == 1 && v.Flags&ctFlagSNAT != 0 && v.NatAddr == a && v.NatPort == port:
			n++
		case k.Dir == 1 && v.Flags&ctFlagSNAT == 0 && k.Daddr == a && k.Dport == port:
			n++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read %s: %v", m, err)
	}
	return n
}

// longLivedConn is an established connection to fe that has lived on
// (liveOn), so that its entries sit in kpr_conntrack.
func longLivedConn(t *testing.T, l *lan, fe netip.AddrPort) net.Conn {
	t.Helper()
	c := establishedConn(t, l, fe)
	l.liveOn(t, c)
	return c
}

// liveOn has c, an established connection, carry a request a second after
// its handshake, and waits for its entries to move to kpr_conntrack.
func (l *lan) liveOn(t *testing.T, c net.Conn) {
	t.Helper()
	time.Sleep(1200 * time.Millisecond)
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	echo(t, c, bufio.NewReader(c), "ping\n")
	l.wantFlowIn(t, netip.MustParseAddrPort(c.LocalAddr().String()), l.loaded.Maps.KprConntrack, "after a request a second after the handshake")
}
