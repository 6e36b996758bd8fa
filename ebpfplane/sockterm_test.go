package ebpfplane

import (
	"errors"
	"net/netip"
	"slices"
	"sort"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

type fakeTerminator struct {
	calls [][]dataplane.RemovedBackend
	err   error
}

func (f *fakeTerminator) Terminate(removed []dataplane.RemovedBackend) (int, error) {
	f.calls = append(f.calls, removed)
	return len(removed), f.err
}

func dns(vip string, backends ...dataplane.Backend) *dataplane.ServicePort {
	return &dataplane.ServicePort{Frontends: []dataplane.Frontend{{
		Addr: netip.MustParseAddr(vip), Port: 53, Protocol: dataplane.UDP, Kind: dataplane.ClusterIP, Backends: backends}}}
}

func TestRemovedUDPBackendsAreTerminatedOncePerSync(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	term := &fakeTerminator{}
	p.SetSocketTerminator(term)
	a, b, c := be("10.244.0.2:53"), be("10.244.0.3:53"), be("10.244.0.4:53")
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("dns1"): dns("10.96.0.10", a, b),
		name("dns2"): dns("10.96.0.11", a, b),
		name("web"):  clusterIP("10.96.0.12", a, b),
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if len(term.calls) != 0 {
		t.Fatalf("creating Services terminated %v", term.calls)
	}

	// a leaves both DNS Services and the TCP one; the TCP one does not count.
	changes := map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("dns1"): dns("10.96.0.10", b, c),
		name("dns2"): dns("10.96.0.11", b),
		name("web"):  clusterIP("10.96.0.12", b),
	}
	if err := p.Apply(changes); err != nil {
		t.Fatal(err)
	}
	if len(term.calls) != 1 || len(term.calls[0]) != 2 {
		t.Fatalf("terminator calls %v, want one call with a leaving two UDP frontends", term.calls)
	}
	for _, r := range term.calls[0] {
		if r.Backend != netip.AddrPortFrom(a.Addr, a.Port) {
			t.Fatalf("terminated %v, want only backend %v", r, a)
		}
	}

	// Nothing removed: no call. A terminator failure is logged, not returned.
	term.err = errors.New("boom")
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("dns2"): dns("10.96.0.11", b, c)}); err != nil {
		t.Fatal(err)
	}
	if len(term.calls) != 1 {
		t.Fatalf("an Apply that removed nothing called the terminator: %v", term.calls[1:])
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("dns2"): nil}); err != nil {
		t.Fatalf("a terminator failure failed the sync: %v", err)
	}
	if len(term.calls) != 2 || len(term.calls[1]) != 2 {
		t.Fatalf("deleting a UDP Service terminated %v, want its two backends", term.calls[1:])
	}
}

// After a restart the Plane has written nothing yet, so the first
// Reconcile compares with what the adopted maps serve: a backend that left
// while kpr was down, and a UDP Service deleted meanwhile, are terminated.
func TestBackendsRemovedWhileKprWasDownAreTerminated(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	a, b := be("10.244.0.2:53"), be("10.244.0.3:53")
	before := New(lb, nil)
	if err := before.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("dns"): dns("10.96.0.10", a, b), name("gone"): dns("10.96.0.11", a),
	}); err != nil {
		t.Fatal(err)
	}
	p := New(lb, nil) // the next kpr, adopting the maps
	term := &fakeTerminator{}
	p.SetSocketTerminator(term)
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{name("dns"): dns("10.96.0.10", b)}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, call := range term.calls {
		for _, r := range call {
			got = append(got, r.Frontend.String()+"->"+r.Backend.String())
		}
	}
	sort.Strings(got)
	if want := []string{"10.96.0.10:53->10.244.0.2:53", "10.96.0.11:53->10.244.0.2:53"}; !slices.Equal(got, want) {
		t.Fatalf("terminated %v, want %v", got, want)
	}
}
