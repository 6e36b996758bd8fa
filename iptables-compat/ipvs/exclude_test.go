package ipvs

import (
	"net/netip"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
)

// --ipvs-exclude-cidrs: a virtual server and an address inside one of the
// ranges stay when their Service goes, at once and after a restart, as in
// kube-proxy; one outside goes.
func TestExcludedCIDRsAreNeverCleanedUp(t *testing.T) {
	k, run := newFakes()
	p := fakePlane(t, k, run)
	p.exclude = []netip.Prefix{netip.MustParsePrefix("10.96.100.0/24")}
	port := func(name, addr string) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "default", Name: name, Protocol: dataplane.TCP},
			Frontends: []dataplane.Frontend{fe(dataplane.ClusterIP, addr, dataplane.TCP, backends("10.244.0.1:8080"), nil)}}
	}
	kept, gone := port("kept", "10.96.100.5:80"), port("gone", "10.96.0.1:80")
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{kept.Name: kept, gone.Name: gone}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{kept.Name: nil, gone.Name: nil}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		svcs, err := k.Services()
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := k.DeviceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		keptKey, goneKey := addrKey(netipAddr("10.96.100.5"), dataplane.TCP, 80), addrKey(netipAddr("10.96.0.1"), dataplane.TCP, 80)
		if svcs[keptKey] == nil {
			t.Errorf("%s: the virtual server in the excluded range was deleted", when)
		}
		if svcs[goneKey] != nil {
			t.Errorf("%s: the virtual server outside the excluded range is still there", when)
		}
		bound := map[netip.Addr]bool{}
		for _, a := range addrs {
			bound[a] = true
		}
		if !bound[netipAddr("10.96.100.5")] || bound[netipAddr("10.96.0.1")] {
			t.Errorf("%s: %s holds %v, want 10.96.100.5 kept and 10.96.0.1 gone", when, DeviceName, addrs)
		}
	}
	check("after the Services went")
	if !dataplanetest.DriftCheckHolds(t, p) {
		t.Error("the drift check finds drift in what the exclusion kept")
	}

	restarted := fakePlane(t, k, run)
	restarted.exclude = p.exclude
	if err := restarted.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{}); err != nil {
		t.Fatal(err)
	}
	check("after a restart with no Services")
}
