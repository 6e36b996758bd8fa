package tcnat

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// ctDirReply is CT_DIR_REPLY of enum ct_dir (bpf/types.h).
const ctDirReply = 1

// rawTCP sends hand-made TCP segments from inside a namespace through raw
// sockets that carry their own IP header (IPPROTO_RAW): segments with any
// source address, as a SYN flood's are, and flag combinations no socket
// sends. The kernel routes them out of the namespace like any packet, so
// they reach the node's device, and kpr's programs, for real.
type rawTCP struct {
	fd4, fd6 int
}

func newRawTCP(t *testing.T, ns *harness.NetNS) *rawTCP {
	t.Helper()
	r := &rawTCP{fd4: -1, fd6: -1}
	err := harness.Do(ns, func() error {
		var err error
		if r.fd4, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err != nil {
			return fmt.Errorf("raw IPv4 socket: %w", err)
		}
		if r.fd6, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err != nil {
			return fmt.Errorf("raw IPv6 socket: %w", err)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, fd := range []int{r.fd4, r.fd6} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send sends f (TCP) as its IP packet: build's frame without the Ethernet
// header, which the namespace's routing adds, and without the padding a
// short frame gets, which the kernel would count into the IP length.
func (r *rawTCP) send(t *testing.T, f flow) {
	t.Helper()
	pkt := build(t, f)[14:]
	if f.dst.Addr().Is4() {
		pkt = pkt[:binary.BigEndian.Uint16(pkt[2:4])]
	} else {
		pkt = pkt[:40+int(binary.BigEndian.Uint16(pkt[4:6]))]
	}
	var err error
	if f.dst.Addr().Is4() {
		err = unix.Sendto(r.fd4, pkt, 0, &unix.SockaddrInet4{Addr: f.dst.Addr().As4()})
	} else {
		err = unix.Sendto(r.fd6, pkt, 0, &unix.SockaddrInet6{Addr: f.dst.Addr().As16()})
	}
	if err != nil {
		t.Fatalf("send %s [%s] on a raw socket: %v", f, f.tcpFlags, err)
	}
}

// flowOf waits up to timeout for the conntrack flow from client to satisfy
// ok, and returns the last one seen (zero and false if it never did).
func (p *progs) flowOf(client netip.AddrPort, timeout time.Duration, ok func(maps.ConntrackFlow) bool) (maps.ConntrackFlow, bool) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	var last maps.ConntrackFlow
	for {
		for _, f := range p.flows() {
			if f.Client == client {
				last = f
				if ok(f) {
					return f, true
				}
			}
		}
		if time.Now().After(deadline) {
			return last, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replyExpiresIn is how long the reply entry of flow f (the one that holds
// its SNAT port, when SNATed) lives on, read from the map.
func (p *progs) replyExpiresIn(f maps.ConntrackFlow) (time.Duration, bool) {
	p.t.Helper()
	key := bpf.KprCtKey{Saddr: addr16(f.Backend.Addr()), Sport: htons(f.Backend.Port()),
		Daddr: addr16(f.Client.Addr()), Dport: htons(f.Client.Port()), Proto: uint8(f.Proto), Dir: ctDirReply}
	if f.SNAT.IsValid() {
		key.Daddr, key.Dport = addr16(f.SNAT.Addr()), htons(f.SNAT.Port())
	}
	var v bpf.KprCtValue
	if err := p.ctLookup(&key, &v); err != nil {
		return 0, false
	}
	return time.Duration(int64(v.ExpiresNs) - int64(monotonicNow(p.t))), true
}

// spoofed is a client address of fam that nothing answers for: the node
// has no route to it, so what kpr sends there is lost.
func spoofed(v6 bool, i int) netip.Addr {
	if v6 {
		a := netip.MustParseAddr("2001:db8:5::").As16()
		a[14], a[15] = byte(i>>8), byte(i)
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte{198, 51, 100, byte(1 + i%250)})
}

func tcpFlow(src, dst netip.AddrPort, flags string) flow {
	return flow{src: src, dst: dst, proto: dataplane.TCP, tcpFlags: flags, empty: true}
}
