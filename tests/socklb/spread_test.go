package socklb

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// Clients often open sockets in groups and send on one of each (a resolver
// opening one per family, say), so the cookies of the sockets that reach a
// Service step by 2, 4 or 8. Every backend must still get its share: the
// UDP hash must not keep the cookie's low bits.
func TestUDPSpreadsWhateverTheCookieStride(t *testing.T) {
	f := newFixture(t, 4, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 53)
	// 1000 queries per case: a backend's fair share is 250 to 500 of them,
	// and the bound below is half of it, more than 9 standard deviations
	// below the share for a fair choice.
	const queries = 1000
	for _, backends := range []int{2, 3, 4} {
		f.service(vip.Addr(), vip.Port(), dataplane.UDP, f.pods[:backends]...)
		for _, stride := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%d-backends/stride-%d", backends, stride), func(t *testing.T) {
				counts, strided := queryInStrides(t, f.node.NetNS, vip, stride, queries)
				// The premise: the used sockets' cookies really do step by
				// the stride (other processes take cookies too, so not
				// always).
				if strided < queries/2 {
					t.Fatalf("only %d of %d consecutive used sockets had cookies %d apart: the test does not produce the pattern it is about", strided, queries-1, stride)
				}
				for _, p := range f.pods[:backends] {
					if min := queries / backends / 2; counts[p.Name] < min {
						t.Errorf("%s answered %d of %d queries, want at least %d (half its share): %v", p.Name, counts[p.Name], queries, min, counts)
					}
				}
				t.Logf("answers %v; %d of %d cookie steps were exactly %d", counts, strided, queries-1, stride)
			})
		}
	}
}

// queryInStrides sends n queries from ns to vip, each from a fresh
// unconnected UDP socket that is the last of a group of stride sockets
// opened together. Reading SO_COOKIE makes the kernel assign each socket's
// cookie in opening order. The thread is pinned to one CPU, since cookies
// come from per-CPU ranges. It returns the answers per backend and how many
// used sockets had a cookie exactly stride above the previous one.
func queryInStrides(t *testing.T, ns *harness.NetNS, vip netip.AddrPort, stride, n int) (map[string]int, int) {
	t.Helper()
	counts := map[string]int{}
	strided := 0
	err := harness.Do(ns, func() error {
		var orig unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			return fmt.Errorf("sched_getaffinity: %w", err)
		}
		var one unix.CPUSet
		for cpu := 0; cpu < 1024; cpu++ {
			if orig.IsSet(cpu) {
				one.Set(cpu)
				break
			}
		}
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return fmt.Errorf("sched_setaffinity: %w", err)
		}
		defer unix.SchedSetaffinity(0, &orig)

		to := &unix.SockaddrInet4{Port: int(vip.Port()), Addr: vip.Addr().As4()}
		var last uint64
		buf := make([]byte, 512)
		for i := 0; i < n; i++ {
			fds := make([]int, 0, stride)
			closeAll := func() {
				for _, fd := range fds {
					unix.Close(fd)
				}
			}
			var cookie uint64
			for j := 0; j < stride; j++ {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					closeAll()
					return fmt.Errorf("socket: %w", err)
				}
				fds = append(fds, fd)
				if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
					closeAll()
					return fmt.Errorf("SO_COOKIE: %w", err)
				}
			}
			if i > 0 && cookie == last+uint64(stride) {
				strided++
			}
			last = cookie
			used := fds[len(fds)-1]
			tv := unix.NsecToTimeval(timeout.Nanoseconds())
			err := unix.SetsockoptTimeval(used, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			if err == nil {
				err = unix.Sendto(used, []byte("q"), 0, to)
			}
			var got int
			if err == nil {
				// A raw blocking recvfrom sees EINTR when the Go runtime's
				// preemption signal lands (often under emulation, as in
				// the kernel-matrix VMs): retry it.
				for {
					if got, _, err = unix.Recvfrom(used, buf, 0); err != unix.EINTR {
						break
					}
				}
			}
			closeAll()
			if err != nil {
				return fmt.Errorf("query %d to %s: %w", i, vip, err)
			}
			name, _, _ := strings.Cut(string(buf[:got]), "\n")
			counts[name]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return counts, strided
}
