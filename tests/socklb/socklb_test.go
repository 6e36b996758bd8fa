package socklb

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

const timeout = 2 * time.Second

func TestTCPSpreadsOverAllBackends(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f.service(fam.vip, 80, dataplane.TCP, f.pods...)
			counts := map[string]int{}
			const connects = 300
			for i := 0; i < connects; i++ {
				who, err := harness.WhoTCP(f.node.NetNS, netip.AddrPortFrom(fam.vip, 80), timeout)
				if err != nil {
					t.Fatalf("connect %d: %v", i, err)
				}
				counts[who]++
			}
			for _, p := range f.pods {
				if counts[p.Name] < connects*15/100 {
					t.Errorf("%s got %d of %d connects, want at least 15%%: %v", p.Name, counts[p.Name], connects, counts)
				}
			}
		})
	}
}

func TestUDPRepliesComeFromTheVIP(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f.service(fam.vip, 53, dataplane.UDP, f.pods...)
			vip := netip.AddrPortFrom(fam.vip, 53)
			seen := map[string]bool{}
			for i := 0; i < 30; i++ {
				who, from, err := harness.WhoUDP(f.node.NetNS, vip, timeout)
				if err != nil {
					t.Fatal(err)
				}
				if from != vip {
					t.Fatalf("reply came from %s, want the VIP %s", from, vip)
				}
				seen[who] = true
			}
			if len(seen) < 2 {
				t.Errorf("30 UDP sockets all reached %v: backend choice does not spread", seen)
			}
			who, err := harness.WhoUDPConnected(f.node.NetNS, vip, timeout)
			if err != nil || who == "" {
				t.Fatalf("connected UDP socket: %q, %v", who, err)
			}
		})
	}
}

func TestUDPSocketKeepsItsBackend(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 53)
	f.service(vip.Addr(), vip.Port(), dataplane.UDP, f.pods...)
	conn, err := harness.ListenUDP(f.node.NetNS, vip.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first := ""
	for i := 0; i < 20; i++ {
		who, from := udpExchange(t, conn, vip)
		if from != vip {
			t.Fatalf("reply from %s, want %s", from, vip)
		}
		if first == "" {
			first = who
		} else if who != first {
			t.Fatalf("datagram %d of one socket went to %s, earlier ones to %s", i, who, first)
		}
	}
}

func udpExchange(t *testing.T, conn *net.UDPConn, to netip.AddrPort) (string, netip.AddrPort) {
	t.Helper()
	if _, err := conn.WriteToUDPAddrPort([]byte("ping"), to); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 512)
	n, from, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	name, _, _ := strings.Cut(string(buf[:n]), "\n")
	return name, netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
}

func TestGetpeernameShowsTheVIP(t *testing.T) {
	f := newFixture(t, 2, loader.MapSizes{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f.service(fam.vip, 80, dataplane.TCP, f.pods...)
			vip := netip.AddrPortFrom(fam.vip, 80)
			conn, err := harness.DialTCP(f.node.NetNS, vip, timeout)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			peer := peerName(t, conn.(*net.TCPConn))
			if peer != vip {
				t.Fatalf("getpeername() = %s, want the VIP %s", peer, vip)
			}
		})
	}
}

// peerName asks the kernel directly: Go may cache the dialed address.
func peerName(t *testing.T, conn syscall.Conn) netip.AddrPort {
	t.Helper()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sa unix.Sockaddr
	var serr error
	raw.Control(func(fd uintptr) { sa, serr = unix.Getpeername(int(fd)) })
	if serr != nil {
		t.Fatal(serr)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	t.Fatalf("unexpected sockaddr %T", sa)
	return netip.AddrPort{}
}

func TestRemovedBackendGetsNoNewConnections(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f.service(fam.vip, 80, dataplane.TCP, f.pods...)
			removed := f.pods[1]
			f.service(fam.vip, 80, dataplane.TCP, f.pods[0], f.pods[2])
			for i := 0; i < 100; i++ {
				who, err := harness.WhoTCP(f.node.NetNS, netip.AddrPortFrom(fam.vip, 80), timeout)
				if err != nil {
					t.Fatal(err)
				}
				if who == removed.Name {
					t.Fatalf("connect %d reached removed backend %s", i, who)
				}
			}
		})
	}
}

func TestNoBackendsRefusesAtOnce(t *testing.T) {
	f := newFixture(t, 1, loader.MapSizes{})
	// Without bpf_set_retval (before 5.18) the hook can only refuse the
	// connect with EPERM, as `kpr probe` says: still at once.
	want := syscall.ECONNREFUSED
	if !f.loaded.Features.Has(loader.FeatureSetRetval) {
		want = syscall.EPERM
	}
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			f.service(fam.vip, 80, dataplane.TCP)
			for _, proto := range []string{"tcp", "udp"} {
				_, err := harness.DialTCP(f.node.NetNS, netip.AddrPortFrom(fam.vip, 80), timeout)
				if proto == "udp" {
					f.service(fam.vip, 53, dataplane.UDP)
					_, err = harness.DialUDP(f.node.NetNS, netip.AddrPortFrom(fam.vip, 53))
				}
				if !errors.Is(err, want) {
					t.Fatalf("%s connect to a service without backends: %v, want %v", proto, err, want)
				}
			}
		})
	}
}

// A dual-stack AF_INET6 socket reaches an IPv4 Service through its
// v4-mapped address.
func TestV4MappedAddressOnDualStackSocket(t *testing.T) {
	f := newFixture(t, 2, loader.MapSizes{})
	vip := families[0].vip
	f.service(vip, 80, dataplane.TCP, f.pods...)
	mapped := netip.AddrFrom16(vip.As16())
	var greeting string
	var peer netip.AddrPort
	err := harness.Do(f.node.NetNS, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return err
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
		if err := unix.Connect(fd, &unix.SockaddrInet6{Port: 80, Addr: mapped.As16()}); err != nil {
			return fmt.Errorf("connect to %s: %w", mapped, err)
		}
		buf := make([]byte, 64)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return err
		}
		greeting = strings.TrimSpace(string(buf[:n]))
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return err
		}
		in6 := sa.(*unix.SockaddrInet6)
		peer = netip.AddrPortFrom(netip.AddrFrom16(in6.Addr).Unmap(), uint16(in6.Port))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(greeting, "backend-") {
		t.Fatalf("greeting %q does not come from a backend", greeting)
	}
	if peer != netip.AddrPortFrom(vip, 80) {
		t.Fatalf("getpeername() = %s, want %s:80", peer, vip)
	}
}

func TestTenThousandServicesStayCorrect(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	const n = 10000
	svcs := make([]maps.Service, 0, n)
	owner := make([]string, n)
	for i := 0; i < n; i++ {
		pod := f.pods[i%len(f.pods)]
		svcs = append(svcs, maps.Service{
			VIPKey:   maps.VIPKey{VIP: maps.VIP{Addr: manyVIP(i), Port: 80, Proto: dataplane.TCP}},
			Backends: []dataplane.Backend{{Addr: pod.IPv4, Port: tcpPort}},
		})
		owner[i] = pod.Name
	}
	if err := f.lb.Upsert(svcs...); err != nil {
		t.Fatal(err)
	}
	if got := len(f.lb.List()); got != n {
		t.Fatalf("%d services in the maps, want %d", got, n)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for k := 0; k < 300; k++ {
		i := rng.IntN(n)
		who, err := harness.WhoTCP(f.node.NetNS, netip.AddrPortFrom(manyVIP(i), 80), timeout)
		if err != nil {
			t.Fatalf("service %d: %v", i, err)
		}
		if who != owner[i] {
			t.Fatalf("service %d (%s) answered by %s, want %s", i, manyVIP(i), who, owner[i])
		}
	}
}

// manyVIP spreads services over 10.100.0.0/16 and up.
func manyVIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
}

func TestRestartKeepsMapsAndOpenConnections(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	f.service(vip.Addr(), vip.Port(), dataplane.TCP, f.pods...)
	before := f.lb.List()
	conn, err := harness.DialTCP(f.node.NetNS, vip, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	// A restart: this process drops every handle, a new loader adopts the pins.
	if err := f.loaded.Close(); err != nil {
		t.Fatal(err)
	}
	f.load(loader.MapSizes{})
	if after := f.lb.List(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("maps changed across restart:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := conn.Write([]byte("still there?\n")); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(timeout))
	echo, err := r.ReadString('\n')
	if err != nil || echo != "still there?\n" {
		t.Fatalf("open connection broke across restart: %q, %v", echo, err)
	}
	if _, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err != nil {
		t.Fatalf("new connect after restart: %v", err)
	}
}

func TestBpftoolShowsFieldNames(t *testing.T) {
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Skip("bpftool not installed (apt-get install bpftool)")
	}
	f := newFixture(t, 1, loader.MapSizes{})
	f.service(families[0].vip, 80, dataplane.TCP, f.pods...)
	out, err := exec.Command("bpftool", "-j", "map", "dump", "pinned", f.bpfRoot+"/kpr_services").Output()
	if err != nil {
		t.Fatalf("bpftool: %v", err)
	}
	var entries []struct {
		Formatted struct {
			Key   map[string]any `json:"key"`
			Value map[string]any `json:"value"`
		} `json:"formatted"`
	}
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatalf("parse bpftool output: %v\n%s", err, out)
	}
	if len(entries) == 0 {
		t.Fatalf("bpftool dumped no entries:\n%s", out)
	}
	for _, field := range []string{"addr", "port", "proto", "scope", "slot"} {
		if _, ok := entries[0].Formatted.Key[field]; !ok {
			t.Errorf("bpftool key has no field %q: %v", field, entries[0].Formatted.Key)
		}
	}
	for _, field := range []string{"backend_id", "count", "rev_nat_id", "affinity_timeout"} {
		if _, ok := entries[0].Formatted.Value[field]; !ok {
			t.Errorf("bpftool value has no field %q: %v", field, entries[0].Formatted.Value)
		}
	}
}

func TestSessionAffinityStickToOneBackendPerClient(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	svc := f.service(vip.Addr(), vip.Port(), dataplane.TCP, f.pods...)
	svc.AffinityTimeout = 60
	if err := f.lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	// The node and a pod are two clients (two network namespaces).
	client, err := f.node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []*harness.NetNS{f.node.NetNS, client.NetNS} {
		seen := map[string]int{}
		for i := 0; i < 30; i++ {
			who, err := harness.WhoTCP(ns, vip, timeout)
			if err != nil {
				t.Fatal(err)
			}
			seen[who]++
		}
		if len(seen) != 1 {
			t.Fatalf("client %s with affinity reached %v, want one backend", ns.Name, seen)
		}
	}
	// Switching affinity off spreads connections again.
	svc.AffinityTimeout = 0
	if err := f.lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := 0; i < 60; i++ {
		who, err := harness.WhoTCP(f.node.NetNS, vip, timeout)
		if err != nil {
			t.Fatal(err)
		}
		seen[who] = true
	}
	if len(seen) < 2 {
		t.Fatalf("affinity off, yet 60 connects all reached %v", seen)
	}
}

// A client with affinity whose backend leaves the Service moves on at its
// next connect, even though that backend still serves another Service and
// so keeps its entry (and id) in the backend map.
func TestSessionAffinityLetsGoOfARemovedBackend(t *testing.T) {
	f := newFixture(t, 3, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	f.service(netip.MustParseAddr("10.96.0.11"), 80, dataplane.TCP, f.pods...)
	svc := f.service(vip.Addr(), vip.Port(), dataplane.TCP, f.pods...)
	svc.AffinityTimeout = 10800
	if err := f.lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	sticky, err := harness.WhoTCP(f.node.NetNS, vip, timeout)
	if err != nil {
		t.Fatal(err)
	}
	var rest []dataplane.Backend
	for i, p := range f.pods {
		if p.Name != sticky {
			rest = append(rest, svc.Backends[i])
		}
	}
	svc.Backends = rest
	if err := f.lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i := 0; i < 20; i++ {
		who, err := harness.WhoTCP(f.node.NetNS, vip, timeout)
		if err != nil {
			t.Fatal(err)
		}
		if who == sticky {
			t.Fatalf("connect %d still reached %s, which left the Service", i, sticky)
		}
		seen[who]++
	}
	if len(seen) != 1 {
		t.Fatalf("after its backend left, the client reached %v, want it to stick to one new backend", seen)
	}
}
