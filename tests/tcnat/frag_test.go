package tcnat

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// The datagram sizes sent through a NodePort in fragments: both are larger
// than the 1500-byte MTU of every link of the topologies, so the client
// and the backend fragment them, and the programs see the fragments.
var fragSizes = []int{4 << 10, 60 << 10}

// UDP datagrams larger than the links' MTU, to a NodePort whose backend is
// on this node: the client's fragments are DNATed on the way in (only the
// first carries the ports) and the backend's echo, fragmented too, leaves
// with the NodePort's address. Both families.
func TestFragmentedUDPToLocalBackend(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	pod := top.pods[0]
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30100)
			backends := top.backends(fe.Addr(), dataplane.UDP, pod)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, backends...)
			for _, size := range fragSizes {
				if err := echoLarge(top.client.NetNS, fe, size, pod.Name, nil); err != nil {
					t.Errorf("%d-byte datagram: %v", size, err)
				}
			}
			checkFragsSeen(t, top.progs, fe.Addr(), backends[0].Addr())
		})
	}
	if s := top.stats(); s.Fragment != 0 || s.DropFragment != 0 {
		t.Errorf("counters %+v, want no fragment passed or dropped untranslated", s)
	}
}

// The same to a NodePort whose backend is on another node: the fragments
// are DNATed and SNATed and redirected, and the backend's fragmented echo
// is un-SNATed and un-DNATed on its way back to the client, which sees it
// from the NodePort, not from the pod.
func TestFragmentedUDPToRemoteBackend(t *testing.T) {
	l := newLAN(t, loader.TCOptions{})
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30101)
			backends := l.backendsOf(fe.Addr(), udpPort)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, backends...)
			for _, size := range fragSizes {
				if err := echoLarge(l.client.NetNS, fe, size, l.remote.Name, nil); err != nil {
					t.Errorf("%d-byte datagram: %v", size, err)
				}
			}
			checkFragsSeen(t, l.progs, fe.Addr(), backends[0].Addr())
		})
	}
	if s := l.stats(); s.Fragment != 0 || s.DropFragment != 0 || s.Snat == 0 {
		t.Errorf("counters %+v, want SNATed flows and no fragment passed or dropped untranslated", s)
	}
}

// An IPv6 datagram with a destination options header between the IPv6 and
// the UDP header reaches the NodePort's backend and its echo comes back
// from the NodePort; so does one large enough to be fragmented, whose
// first fragment has the options behind its fragment header.
func TestIPv6DestinationOptionsToNodePort(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	pod := top.pods[0]
	fe := netip.AddrPortFrom(nodeAddr(true), 30102)
	top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, top.backends(fe.Addr(), dataplane.UDP, pod)...)
	// Next header (the kernel fills it in), length 0 (8 bytes), and a
	// PadN option filling the rest.
	dstopts := []byte{0, 0, 1, 4, 0, 0, 0, 0}
	withOptions := func(c *net.UDPConn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, string(dstopts))
		}); err != nil {
			return err
		}
		return serr
	}
	for _, size := range []int{64, fragSizes[0]} {
		if err := echoLarge(top.client.NetNS, fe, size, pod.Name, withOptions); err != nil {
			t.Errorf("%d-byte datagram with destination options: %v", size, err)
		}
	}
	if s := top.stats(); s.Translated == 0 || s.Ipv6ExtUnparsed != 0 || s.Fragment != 0 {
		t.Errorf("counters %+v, want translated packets, none passed for an extension header or a fragment", s)
	}
}

// echoLarge sends a datagram of size random bytes from ns to fe and waits
// for the UDP echo server's reply: it must come from fe, from the pod
// named who, with the payload unchanged. setup, if set, prepares the
// socket. UDP may lose a datagram, so it tries three times.
func echoLarge(ns *harness.NetNS, fe netip.AddrPort, size int, who string, setup func(*net.UDPConn) error) error {
	c, err := harness.ListenUDP(ns, fe.Addr())
	if err != nil {
		return err
	}
	defer c.Close()
	if setup != nil {
		if err := setup(c); err != nil {
			return fmt.Errorf("set the socket up: %w", err)
		}
	}
	payload := make([]byte, size)
	_, _ = rand.Read(payload)
	buf := make([]byte, 64<<10)
	var last error
	for try := 0; try < 3; try++ {
		if _, err := c.WriteToUDPAddrPort(payload, fe); err != nil {
			return fmt.Errorf("send to %s: %w", fe, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			last = fmt.Errorf("no echo from %s: %w", fe, err)
			continue
		}
		want := who + "\n"
		switch {
		case from != fe:
			return fmt.Errorf("echo from %s, want %s", from, fe)
		case n != len(want)+size || string(buf[:len(want)]) != want || string(buf[len(want):n]) != string(payload):
			return fmt.Errorf("echo of %d bytes is not %q and the %d bytes sent", n, want, size)
		}
		return nil
	}
	return last
}

// checkFragsSeen checks that the programs saw the datagrams in fragments
// both ways: kpr_frags holds a first fragment to the frontend (the
// client's) and one from the backend (its echo).
func checkFragsSeen(t *testing.T, p *progs, frontend, backend netip.Addr) {
	t.Helper()
	var k bpf.KprFragKey
	var v bpf.KprFragValue
	toFrontend, fromBackend := false, false
	it := p.loaded.Maps.KprFrags.Iterate()
	for it.Next(&k, &v) {
		toFrontend = toFrontend || k.Daddr == addr16(frontend)
		fromBackend = fromBackend || k.Saddr == addr16(backend)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read kpr_frags: %v", err)
	}
	if !toFrontend || !fromBackend {
		t.Errorf("kpr_frags has a first fragment to %s: %v, from %s: %v; want both (the datagrams were not fragmented?)",
			frontend, toFrontend, backend, fromBackend)
	}
}
