package ipvs

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
)

func netipAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// Cleanup removes every virtual server, address, set and chain the Plane
// wrote, and leaves another program's virtual server and the node's other
// rules alone.
func TestCleanupRemovesWhatThePlaneWrote(t *testing.T) {
	k, run := newFakes()
	p := fakePlane(t, k, run)
	sp := goldenCases()["local-policy-source-ranges"]
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
		t.Fatal(err)
	}
	foreign := Service{Key: addrKey(netipAddr("192.0.2.1"), dataplane.TCP, 80), Scheduler: "wlc"}
	if err := k.AddService(foreign); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Run("iptables-nft-restore", []string{"--noflush"}, []byte("*nat\n:OTHER - [0:0]\n-A OUTPUT -j OTHER\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}

	n, err := Cleanup(k, run)
	if err != nil {
		t.Fatal(err)
	}
	if n != 8 {
		t.Errorf("Cleanup deleted %d virtual servers, want the Plane's 8", n)
	}
	svcs, _ := k.Services()
	if len(svcs) != 1 || svcs[foreign.Key] == nil {
		t.Errorf("after Cleanup the virtual servers are %v, want only the foreign one", svcs)
	}
	if k.device || len(k.addrs) > 0 || len(k.sets) > 0 {
		t.Errorf("after Cleanup: device %v, addresses %v, sets %v; want none", k.device, k.addrs, k.sets)
	}
	for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		for _, table := range tables {
			out, _ := run.Run(bin, []string{"-t", table}, nil)
			if strings.Contains(string(out), chainPrefix) {
				t.Errorf("%s -t %s still holds kpr's chains:\n%s", bin, table, out)
			}
		}
	}
	if out, _ := run.Run("iptables-nft-save", []string{"-t", "nat"}, nil); !strings.Contains(string(out), "-A OUTPUT -j OTHER") {
		t.Errorf("Cleanup removed a rule that is not kpr's:\n%s", out)
	}
}
