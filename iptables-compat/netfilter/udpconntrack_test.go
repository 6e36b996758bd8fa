package netfilter

import (
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
)

type recordingCleaner struct {
	calls []UDPFrontends
	err   error
}

func (c *recordingCleaner) DeleteStaleUDP(served UDPFrontends) (int, error) {
	c.calls = append(c.calls, served)
	return 0, c.err
}

func udpPort(name, vip string, backends ...string) *dataplane.ServicePort {
	ap := netip.MustParseAddrPort(vip)
	var bs []dataplane.Backend
	for _, b := range backends {
		bp := netip.MustParseAddrPort(b)
		bs = append(bs, dataplane.Backend{Addr: bp.Addr(), Port: bp.Port()})
	}
	return &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "ns", Name: name, Protocol: dataplane.UDP},
		Frontends: []dataplane.Frontend{{Addr: ap.Addr(), Port: ap.Port(), Protocol: dataplane.UDP, Backends: bs}}}
}

func frontends(pairs map[string][]string) UDPFrontends {
	out := UDPFrontends{}
	for fe, bs := range pairs {
		set := map[netip.AddrPort]bool{}
		for _, b := range bs {
			set[netip.MustParseAddrPort(b)] = true
		}
		out[netip.MustParseAddrPort(fe)] = set
	}
	return out
}

type spMap = map[dataplane.ServicePortName]*dataplane.ServicePort

// What each sync compares with the kernel: everything at the first sync
// and at a full one, and until a comparison succeeds; nothing after a
// sync that changed no UDP ServicePort; a gone frontend with no backend
// at all; only the families the backend programs.
func TestUDPConntrackSynced(t *testing.T) {
	ct := &recordingCleaner{}
	u := NewUDPConntrack(ct, []Family{IPv4}, nil)
	dns := udpPort("dns", "10.96.0.10:53", "10.244.0.10:53")
	dns6 := udpPort("dns6", "[fd00::10]:53", "[fd00:244::10]:53")
	tcp := &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "ns", Name: "web", Protocol: dataplane.TCP},
		Frontends: []dataplane.Frontend{{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: dataplane.TCP}}}
	next := spMap{dns.Name: dns, dns6.Name: dns6, tcp.Name: tcp}

	// The first sync changed only the TCP Service, yet the kernel may
	// hold anything from before the start.
	u.Synced(nil, next, []dataplane.ServicePortName{tcp.Name}, false)
	want := frontends(map[string][]string{"10.96.0.10:53": {"10.244.0.10:53"}})
	if len(ct.calls) != 1 || !maps.EqualFunc(ct.calls[0], want, maps.Equal) {
		t.Fatalf("first sync compared %v, want %v (IPv4 only: the backend programs no IPv6)", ct.calls, want)
	}
	u.Synced(next, next, []dataplane.ServicePortName{tcp.Name}, false)
	if len(ct.calls) != 1 {
		t.Fatalf("a TCP-only sync compared %v", ct.calls[1:])
	}
	u.Synced(next, next, nil, true)
	if len(ct.calls) != 2 {
		t.Fatalf("a full sync compared nothing")
	}

	// The Service goes away: its frontend has no backend left, and the
	// comparison fails, so the next sync, TCP-only as it is, tries again.
	ct.err = errors.New("netlink says no")
	other := udpPort("other", "10.96.0.12:53", "10.244.0.12:53")
	after := spMap{tcp.Name: tcp, other.Name: other}
	u.Synced(next, after, []dataplane.ServicePortName{dns.Name, other.Name}, false)
	want = frontends(map[string][]string{"10.96.0.10:53": nil, "10.96.0.12:53": {"10.244.0.12:53"}})
	if len(ct.calls) != 3 || !maps.EqualFunc(ct.calls[2], want, maps.Equal) {
		t.Fatalf("deleting the Service compared %v, want %v", ct.calls[2:], want)
	}
	ct.err = nil
	u.Synced(after, after, []dataplane.ServicePortName{tcp.Name}, false)
	if len(ct.calls) != 4 {
		t.Fatalf("the sync after a failed comparison compared nothing")
	}
}

// The filter deletes what reaches a UDP frontend's traffic anywhere but
// to a current backend: a removed backend, no translation at all.
func TestStaleUDPFilter(t *testing.T) {
	f := staleUDPFilter(frontends(map[string][]string{"10.96.0.10:53": {"10.244.0.10:5353"}, "10.96.0.11:53": nil}))
	flow := func(proto uint8, dst, replySrc string) *netlink.ConntrackFlow {
		d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
		fl := &netlink.ConntrackFlow{}
		fl.Forward.Protocol = proto
		fl.Forward.DstIP, fl.Forward.DstPort = net.IP(d.Addr().AsSlice()), d.Port()
		fl.Reverse.SrcIP, fl.Reverse.SrcPort = net.IP(r.Addr().AsSlice()), r.Port()
		return fl
	}
	for _, c := range []struct {
		what       string
		flow       *netlink.ConntrackFlow
		wantDelete bool
	}{
		{"to the current backend", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.10:5353"), false},
		{"to a removed backend", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.20:5353"), true},
		{"to the backend's address on another port", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.10:53"), true},
		{"untranslated", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.96.0.10:53"), true},
		{"to a frontend without backends", flow(unix.IPPROTO_UDP, "10.96.0.11:53", "10.244.0.10:5353"), true},
		{"TCP", flow(unix.IPPROTO_TCP, "10.96.0.10:53", "10.244.0.20:5353"), false},
		{"to another port of the address", flow(unix.IPPROTO_UDP, "10.96.0.10:54", "10.96.0.10:54"), false},
		{"to an address kpr does not serve", flow(unix.IPPROTO_UDP, "10.0.0.1:53", "10.0.0.1:53"), false},
	} {
		if got := f.MatchConntrackFlow(c.flow); got != c.wantDelete {
			t.Errorf("flow %s: deleted %v, want %v", c.what, got, c.wantDelete)
		}
	}
}

// The UDP frontends of Service rules, as iptables-save prints them.
func TestUDPFrontendsOfRules(t *testing.T) {
	saved, err := ParseSave([]byte(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:OTHER - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-A
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-B
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -d 192.168.0.10/32 -p udp -m udp --dport 30053 -j KUBE-EXT-A
-A KUBE-SERVICES -d 10.0.0.0/8 -p udp -m udp --dport 53 -j KUBE-SVC-C
-A OTHER -d 10.96.0.11/32 -p udp -m udp --dport 53 -j ACCEPT
COMMIT
`))
	if err != nil {
		t.Fatal(err)
	}
	got := UDPFrontendsOfRules(saved["nat"], "KUBE-SERVICES", "KUBE-NODEPORTS")
	want := []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("192.168.0.10:30053")}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v (UDP, one address, the chains asked for)", got, want)
	}
}

// A frontend found in the kernel's rules and no longer served is compared
// as one without backends, once; one still served keeps its backends.
func TestUDPConntrackFoundInKernel(t *testing.T) {
	ct := &recordingCleaner{}
	u := NewUDPConntrack(ct, []Family{IPv4}, nil)
	dns := udpPort("dns", "10.96.0.10:53", "10.244.0.10:53")
	next := spMap{dns.Name: dns}
	u.FoundInKernel([]netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.96.0.99:53")})
	u.Synced(nil, next, []dataplane.ServicePortName{dns.Name}, false)
	want := frontends(map[string][]string{"10.96.0.10:53": {"10.244.0.10:53"}, "10.96.0.99:53": nil})
	if len(ct.calls) != 1 || !maps.EqualFunc(ct.calls[0], want, maps.Equal) {
		t.Fatalf("compared %v, want %v", ct.calls, want)
	}
	u.Synced(next, next, []dataplane.ServicePortName{dns.Name}, false)
	want = frontends(map[string][]string{"10.96.0.10:53": {"10.244.0.10:53"}})
	if len(ct.calls) != 2 || !maps.EqualFunc(ct.calls[1], want, maps.Equal) {
		t.Fatalf("the second sync compared %v, want %v (the frontend found is handled)", ct.calls[1:], want)
	}
}
