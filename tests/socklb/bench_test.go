package socklb

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// BenchmarkConnect measures what the socket LB adds to connect(): each
// iteration makes one TCP connect to a Service VIP and one straight to the
// backend, alternating which goes first, on raw blocking sockets so that Go's
// poller does not dilute the difference. It reports both latencies and their
// ratio, measured side by side, at several map sizes.
//
//	go test ./tests/socklb -run '^$' -bench Connect -benchtime 5000x
func BenchmarkConnect(b *testing.B) {
	f := newFixture(b, 1, loader.MapSizes{})
	backend := netip.AddrPortFrom(f.pods[0].IPv4, tcpPort)
	loaded := 0
	for _, n := range []int{1, 1000, 10000, 50000} {
		// Grow the maps to n Services; the probed VIP is the last one.
		svcs := make([]maps.Service, 0, n-loaded)
		for i := loaded; i < n; i++ {
			svcs = append(svcs, maps.Service{
				VIPKey:   maps.VIPKey{VIP: maps.VIP{Addr: manyVIP(i), Port: 80, Proto: dataplane.TCP}},
				Backends: []dataplane.Backend{{Addr: backend.Addr(), Port: backend.Port()}},
			})
		}
		if err := f.lb.Upsert(svcs...); err != nil {
			b.Fatal(err)
		}
		loaded = n
		vip := netip.AddrPortFrom(manyVIP(n-1), 80)

		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchConnect(b, f, vip, backend) })
	}
}

// BenchmarkConnectSocketLB measures what --socket-lb per-pod adds to a
// served socket's connect(): the hooks look the socket's network namespace
// up in kpr_sock_bypass after the frontend lookup. Each mode loads the
// programs afresh with 1,000 Services; per-pod has 100 other pods'
// namespaces in the map, as a node with meshed pods would. Compare the
// vip/direct ratios of the two modes, each measured side by side.
//
//	go test ./tests/socklb -run '^$' -bench ConnectSocketLB -benchtime 5000x -count 3
func BenchmarkConnectSocketLB(b *testing.B) {
	for _, mode := range []loader.SocketLBMode{loader.SocketLBAll, loader.SocketLBPerPod} {
		b.Run("socket-lb="+mode.String(), func(b *testing.B) {
			f := newSocketLBFixture(b, 1, loader.MapSizes{}, mode)
			backend := netip.AddrPortFrom(f.pods[0].IPv4, tcpPort)
			const n = 1000
			svcs := make([]maps.Service, 0, n)
			for i := range n {
				svcs = append(svcs, maps.Service{
					VIPKey:   maps.VIPKey{VIP: maps.VIP{Addr: manyVIP(i), Port: 80, Proto: dataplane.TCP}},
					Backends: []dataplane.Backend{{Addr: backend.Addr(), Port: backend.Port()}},
				})
			}
			if err := f.lb.Upsert(svcs...); err != nil {
				b.Fatal(err)
			}
			bypass := maps.NewSockBypass(f.loaded.Maps.KprSockBypass)
			for cookie := uint64(1); cookie <= 100; cookie++ {
				// Cookies count up from the boot's first namespace:
				// these belong to no namespace of this test.
				if err := bypass.Set(1<<40+cookie, maps.SockBypassMesh); err != nil {
					b.Fatal(err)
				}
			}
			benchConnect(b, f, netip.AddrPortFrom(manyVIP(n-1), 80), backend)
		})
	}
}

// benchConnect is one BenchmarkConnect measurement: connects to vip and
// straight to backend, side by side, reported as medians and their ratio.
func benchConnect(b *testing.B, f *fixture, vip, backend netip.AddrPort) {
	viaVIP := make([]time.Duration, 0, b.N)
	direct := make([]time.Duration, 0, b.N)
	err := harness.Do(f.node.NetNS, func() error {
		// Warm caches (neighbour entries, map pages) outside the timer.
		for i := 0; i < 100; i++ {
			if _, err := timedConnect(vip); err != nil {
				return err
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			first, second := vip, backend
			if i%2 == 1 {
				first, second = backend, vip
			}
			d1, err := timedConnect(first)
			if err != nil {
				return err
			}
			d2, err := timedConnect(second)
			if err != nil {
				return err
			}
			if first == vip {
				viaVIP, direct = append(viaVIP, d1), append(direct, d2)
			} else {
				viaVIP, direct = append(viaVIP, d2), append(direct, d1)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	// Medians: a connect on a shared 2-core machine has a long, noisy
	// tail that says nothing about the BPF program.
	v, d := median(viaVIP), median(direct)
	b.ReportMetric(float64(v.Nanoseconds()), "vip-p50-ns")
	b.ReportMetric(float64(d.Nanoseconds()), "direct-p50-ns")
	b.ReportMetric(float64(v)/float64(d), "vip/direct")
}

// timedConnect times socket+connect on a blocking socket, then resets the
// connection (SO_LINGER 0) so no TIME_WAIT state piles up.
func timedConnect(to netip.AddrPort) (time.Duration, error) {
	start := time.Now()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: to.Addr().As4(), Port: int(to.Port())})
	elapsed := time.Since(start)
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
	if err != nil {
		return 0, fmt.Errorf("connect %s: %w", to, err)
	}
	return elapsed, nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
