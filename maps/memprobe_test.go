package maps

import (
	"net/netip"
	"runtime"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/tests/memprobe"
)

// BenchmarkMirrorHeap reports the live heap of the LB's in-memory mirror
// (id maps, reference counts, per-Service state) at 10,000 one-frontend
// Services of 10 distinct backends each, the shape of tests/syncperf.
// It is a measurement, run by hand:
//
//	go test ./maps -run '^$' -bench MirrorHeap -benchtime 1x
func BenchmarkMirrorHeap(b *testing.B) {
	for range b.N {
		b.ReportMetric(float64(mirrorBytes(b, 10000, 10))/1e6, "mirror-MB")
	}
}

// TestMirrorIsCompact keeps the mirror at about its size now: 110 bytes
// per backend at 10 backends per Service (it was 195 with a netip.Addr
// per backend twice and separate maps for addresses, reference counts and
// the allocator's ids).
func TestMirrorIsCompact(t *testing.T) {
	const services, perService = 10000, 10
	perBackend := float64(mirrorBytes(t, services, perService)) / (services * perService)
	if perBackend > 140 {
		t.Fatalf("the LB's mirror takes %.0f bytes per backend, want at most 140: at 100,000 backends every byte is 0.1 MB of kpr's heap", perBackend)
	}
}

// mirrorBytes is the live heap of the mirror of services one-frontend
// Services with perService distinct backends each.
func mirrorBytes(tb testing.TB, services, perService int) uint64 {
	{
		lb := NewInMemory(2*services*(perService+1), 2*services*perService, 2*services)
		base := netip.MustParseAddr("100.64.0.0").As4()
		for i := range services {
			svc := Service{VIPKey: VIPKey{VIP: VIP{
				Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: dataplane.TCP}}}
			for j := range perService {
				n := i*perService + j
				a := base
				a[2], a[3] = byte(n>>8), byte(n)
				a[1] += byte(n >> 16)
				svc.Backends = append(svc.Backends, dataplane.Backend{Addr: netip.AddrFrom4(a), Port: 8080})
			}
			if err := lb.Upsert(svc); err != nil {
				tb.Fatal(err)
			}
		}
		with := memprobe.LiveHeap()
		dropMirror(lb)
		without := memprobe.LiveHeap()
		runtime.KeepAlive(lb)
		return with - without
	}
}

// dropMirror lets the collector free everything the LB mirrors of the
// maps, keeping the tables themselves.
func dropMirror(lb *LB) {
	lb.svcs, lb.backendIDs, lb.backendOf = nil, nil, nil
	lb.revNatIDs, lb.revNatRefs, lb.matches = nil, nil, nil
	lb.backendAlloc, lb.revNatAlloc = nil, nil
}
