package ebpfplane_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
)

// maglevRevNats is the size of kpr_rev_nat in the Maglev tests. Every
// write of kpr_maglev, a map of maps, waits for an RCU grace period in
// the kernel (milliseconds): the tests keep to a few hundred.
const maglevRevNats = 32

// newMaglevOuter creates kpr_maglev as the loader sizes it beside a
// kpr_rev_nat of revNats entries. The object's own size for it is set to
// revNats first, half of what two scopes need: what counts is the size
// the loader gives it, whatever the object declares (its 65536 is only
// outgrown by a kpr_rev_nat of more than 32768, which would take the
// kernel minutes to fill).
func newMaglevOuter(t *testing.T, revNats uint32) *ebpf.Map {
	t.Helper()
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps[bpf.KprMapKprMaglev].MaxEntries = revNats
	loader.SizeMaps(spec, loader.MapSizes{RevNat: revNats})
	ms := spec.Maps[bpf.KprMapKprMaglev].Copy()
	ms.Pinning = ebpf.PinNone
	outer, err := ebpf.NewMap(ms)
	if err != nil {
		t.Skipf("create %s (needs root, or CAP_BPF): %v", bpf.KprMapKprMaglev, err)
	}
	t.Cleanup(func() { outer.Close() })
	return outer
}

// newMaglevPlane is a Plane over lb that writes the Maglev tables into
// outer, and the log of its warnings.
func newMaglevPlane(t *testing.T, lb *maps.LB, outer *ebpf.Map) (*ebpfplane.Plane, *maps.Maglev, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	p := ebpfplane.New(lb, zap.New(core))
	mg, err := maps.NewMaglev(lb, outer, maglev.MinTableSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mg.Close() })
	p.SetMaglev(mg)
	return p, mg, logs
}

// nodePorts are n ServicePorts of one NodePort frontend each, numbered
// from first, with externalTrafficPolicy Local: an internal and an
// external scope, a table each, the most one reverse-NAT id keys.
func nodePorts(first, n int) map[dataplane.ServicePortName]*dataplane.ServicePort {
	backend := []dataplane.Backend{{Addr: netip.MustParseAddr("10.244.0.2"), Port: 8080}}
	out := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for i := first; i < first+n; i++ {
		out[dataplane.ServicePortName{Namespace: "default", Name: fmt.Sprintf("np-%05d", i), Protocol: dataplane.TCP}] = &dataplane.ServicePort{
			Frontends: []dataplane.Frontend{{
				Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Port: 30000, Protocol: dataplane.TCP,
				Kind: dataplane.NodePort, Backends: backend, ExternalBackends: backend}}}
	}
	return out
}

// checkMaglevTables fails unless every frontend and scope of lb has its
// table in outer, and no table write failed.
func checkMaglevTables(t *testing.T, lb *maps.LB, outer *ebpf.Map, logs *observer.ObservedLogs, want int) {
	t.Helper()
	if failed := logs.FilterMessageSnippet("Maglev table").All(); len(failed) > 0 {
		t.Fatalf("%d Maglev table writes failed, first: %v", len(failed), failed[0].ContextMap())
	}
	tables, err := maps.MaglevTables(lb, outer)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != want || len(lb.Keys()) != want {
		t.Fatalf("kpr_maglev holds the tables of %d of %d frontends and scopes, want %d", len(tables), len(lb.Keys()), want)
	}
}

// kpr_maglev, as the loader sizes it beside kpr_rev_nat, has room for the
// tables of every frontend kpr_rev_nat admits: filled to the last
// reverse-NAT id with Maglev frontends served in both scopes, every
// frontend has its tables and no table write fails, and the next Service
// is refused by kpr_rev_nat (MapFull), not admitted without a table.
func TestMaglevTablesFitEveryFrontendRevNatAdmits(t *testing.T) {
	outer := newMaglevOuter(t, maglevRevNats)
	lb := maps.NewInMemorySized(map[string]int{bpf.KprMapKprRevNat: maglevRevNats})
	p, _, logs := newMaglevPlane(t, lb, outer)

	if err := p.Apply(nodePorts(0, maglevRevNats)); err != nil {
		t.Fatal(err)
	}
	if refused := p.Refused(); len(refused) != 0 {
		t.Fatalf("%d ServicePorts refused while kpr_rev_nat has room for all: %v", len(refused), refused)
	}
	checkMaglevTables(t, lb, outer, logs, 2*maglevRevNats)

	next := nodePorts(maglevRevNats, 1)
	if err := p.Apply(next); err != nil {
		t.Fatal(err)
	}
	for name := range next {
		r, ok := p.Refused()[name]
		if !ok || r.Reason != dataplane.RefusedMapFull || !strings.Contains(r.Message, bpf.KprMapKprRevNat) ||
			!strings.Contains(r.Message, "--map-size-revnat") {
			t.Fatalf("Refused() = %+v, want %s refused as MapFull by %s, naming --map-size-revnat", p.Refused(), name, bpf.KprMapKprRevNat)
		}
	}
	checkMaglevTables(t, lb, outer, logs, 2*maglevRevNats)
}

// The tables a kpr before this one wrote take no room from the tables of
// the Services that replaced theirs while kpr was down: the first
// reconcile after the restart deletes those Services, and their tables
// with them, before it writes the new ones, whose reverse-NAT ids differ.
func TestMaglevTablesOfAnEarlierKprMakeRoomForNewOnes(t *testing.T) {
	outer := newMaglevOuter(t, maglevRevNats)
	lb := maps.NewInMemorySized(map[string]int{bpf.KprMapKprRevNat: maglevRevNats})
	p, mg, logs := newMaglevPlane(t, lb, outer)
	if err := p.Apply(nodePorts(0, maglevRevNats)); err != nil {
		t.Fatal(err)
	}
	checkMaglevTables(t, lb, outer, logs, 2*maglevRevNats)

	// kpr stops; the Services are replaced; kpr starts again over the
	// same maps.
	if err := mg.Close(); err != nil {
		t.Fatal(err)
	}
	lb = lb.ReopenInMemory(false)
	p, _, logs = newMaglevPlane(t, lb, outer)
	if err := p.Reconcile(nodePorts(maglevRevNats, maglevRevNats)); err != nil {
		t.Fatal(err)
	}
	if refused := p.Refused(); len(refused) != 0 {
		t.Fatalf("%d ServicePorts refused while kpr_rev_nat has room for all: %v", len(refused), refused)
	}
	checkMaglevTables(t, lb, outer, logs, 2*maglevRevNats)
}
