package ebpfplane

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

// manyClusterIPs returns n ServicePorts svc-00000… with ClusterIP
// 10.96.x.y and two backends each.
func manyClusterIPs(n int) map[dataplane.ServicePortName]*dataplane.ServicePort {
	sps := make(map[dataplane.ServicePortName]*dataplane.ServicePort, n)
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()
		sps[name(fmt.Sprintf("svc-%05d", i))] = clusterIP(vip,
			dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: 8080},
			dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)}), Port: 8080})
	}
	return sps
}

// TestWriteMovesAFrontendAcrossChunks: write upserts writeChunk
// ServicePorts at a time, but a frontend that one ServicePort drops and
// another (in a different chunk, before or after it) takes in the same
// call must stay in the maps, with the new owner's backends.
func TestWriteMovesAFrontendAcrossChunks(t *testing.T) {
	const n = 3*writeChunk + 10
	lb := maps.NewInMemory(10*n, 10*n, 10*n)
	p := New(lb, nil)
	all := manyClusterIPs(n)
	// Two extra frontends, held first by an early and a late ServicePort.
	early, late := name("svc-00001"), name(fmt.Sprintf("svc-%05d", n-2))
	withExtra := func(sp *dataplane.ServicePort, vip string) *dataplane.ServicePort {
		out := *sp
		out.Frontends = append(append([]dataplane.Frontend(nil), sp.Frontends...), clusterIP(vip, be("10.250.0.1:80")).Frontends[0])
		out.Frontends[1].Kind = dataplane.ExternalIP
		return &out
	}
	all[early] = withExtra(all[early], "192.0.2.1")
	all[late] = withExtra(all[late], "192.0.2.2")
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	// In one Apply, each extra frontend moves to a ServicePort chunks
	// away: the late one's to an early ServicePort and the other way round.
	takerOfLate, takerOfEarly := name("svc-00002"), name(fmt.Sprintf("svc-%05d", n-3))
	changes := map[dataplane.ServicePortName]*dataplane.ServicePort{
		early:        manyClusterIPs(n)[early],
		late:         manyClusterIPs(n)[late],
		takerOfLate:  withExtra(all[takerOfLate], "192.0.2.2"),
		takerOfEarly: withExtra(all[takerOfEarly], "192.0.2.1"),
	}
	// Enough unchanged ServicePorts in between that the four fall in
	// different chunks.
	for sp, v := range manyClusterIPs(n) {
		if _, ok := changes[sp]; !ok {
			changes[sp] = v
		}
	}
	if err := p.Apply(changes); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []string{"192.0.2.1", "192.0.2.2"} {
		if _, ok := lb.Get(key(vip, maps.ScopeInternal)); !ok {
			t.Errorf("frontend %s, moved to a ServicePort in another chunk, was deleted", vip)
		}
	}
	if got, want := len(lb.List()), n+2; got != want {
		t.Fatalf("the maps hold %d frontends, want %d", got, want)
	}
	// And a Reconcile without them removes both.
	if err := p.Reconcile(manyClusterIPs(n)); err != nil {
		t.Fatal(err)
	}
	if got := len(lb.List()); got != n {
		t.Fatalf("after the reconcile the maps hold %d frontends, want %d", got, n)
	}
}

// TestFirstReconcileAllocatesLittle holds what the first Reconcile of a
// start-up allocates per ServicePort, beside the LB's own mirror and
// tables: an expansion without a map of its own, and no set of the
// backends a UDP frontend keeps unless the maps serve UDP backends it
// could lose. A one-frontend TCP ServicePort of two backends cost 1,500
// bytes before; now about 950.
func TestFirstReconcileAllocatesLittle(t *testing.T) {
	const n = 5000
	all := manyClusterIPs(n)
	lb := maps.NewInMemory(10*n, 10*n, 10*n)
	// What the LB allocates for the same entries, written directly.
	direct := maps.NewInMemory(10*n, 10*n, 10*n)
	var svcs []maps.Service
	for _, sp := range all {
		svcs = append(svcs, expand(sp)...)
	}
	lbAlloc := allocated(func() {
		if err := direct.Upsert(svcs...); err != nil {
			t.Fatal(err)
		}
	})
	p := New(lb, nil)
	planeAlloc := allocated(func() {
		if err := p.Reconcile(all); err != nil {
			t.Fatal(err)
		}
	})
	perPort := (int64(planeAlloc) - int64(lbAlloc)) / n
	t.Logf("the plane allocates %d bytes per ServicePort beside the LB's %d", perPort, lbAlloc/n)
	if perPort > 1200 {
		t.Fatalf("a first Reconcile allocates %d bytes per ServicePort beside the LB's, want at most 1200", perPort)
	}
}

func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
