package socklb

import (
	"net/netip"
	"testing"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// An entry deleted by hand (say, with bpftool) is put back by the next
// full reconcile, and the Service answers again on every backend.
func TestReconcileRepairsAnEntryDeletedByHand(t *testing.T) {
	f := newFixture(t, 2, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	plane := ebpfplane.New(f.lb, nil)
	name := dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP}
	desired := map[dataplane.ServicePortName]*dataplane.ServicePort{name: {Frontends: []dataplane.Frontend{{
		Addr: vip.Addr(), Port: vip.Port(), Protocol: dataplane.TCP, Kind: dataplane.ClusterIP,
		Backends: []dataplane.Backend{{Addr: f.pods[0].IPv4, Port: tcpPort}, {Addr: f.pods[1].IPv4, Port: tcpPort}},
	}}}}
	if err := plane.Reconcile(desired); err != nil {
		t.Fatal(err)
	}

	// Break it behind kpr's back: drop the master entry.
	var master bpf.KprSvcKey
	var found bool
	var k bpf.KprSvcKey
	var v bpf.KprSvcValue
	it := f.loaded.Maps.KprServices.Iterate()
	for it.Next(&k, &v) {
		if k.Slot == 0 {
			master, found = k, true
		}
	}
	if !found {
		t.Fatal("no master entry in the service map")
	}
	if err := f.loaded.Maps.KprServices.Delete(master); err != nil {
		t.Fatal(err)
	}
	if _, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err == nil {
		t.Fatal("the Service still answered without its master entry: the test broke nothing")
	}

	if err := plane.Reconcile(desired); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		who, err := harness.WhoTCP(f.node.NetNS, vip, timeout)
		if err != nil {
			t.Fatalf("after reconcile: %v", err)
		}
		seen[who] = true
	}
	if len(seen) != 2 {
		t.Fatalf("after reconcile the Service reached %v, want both backends", seen)
	}
}
