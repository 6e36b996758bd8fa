package ipvs

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// programmed is a fake kernel and tables holding what a Plane wrote for sp.
func programmed(t *testing.T, sp *dataplane.ServicePort) (*fakeKernel, *netfiltertest.IPTables) {
	t.Helper()
	k, run := newFakes()
	if err := fakePlane(t, k, run).Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
		t.Fatal(err)
	}
	return k, run
}

func inspectPorts(t *testing.T, k *fakeKernel, run *netfiltertest.IPTables, sp *dataplane.ServicePort) dataplane.Inspection {
	t.Helper()
	in, err := newInspector(k, run, inspectFamilies)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	got, err := in.InspectPorts([]dataplane.ServicePort{*sp})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// What a Plane wrote reads back as matching, every frontend's virtual
// server with its real servers, and the node's own traffic to a Local
// frontend through its firewall-mark virtual server.
func TestInspectPortsMatchesWhatThePlaneWrote(t *testing.T) {
	sp := goldenCases()["local-policy-source-ranges"]
	k, run := programmed(t, sp)
	got := inspectPorts(t, k, run, sp)
	if len(got.Divergences) != 0 {
		t.Errorf("divergences %q, want none", got.Divergences)
	}
	var lines []string
	for _, r := range got.Rows {
		v := r.(VirtualServer)
		if !v.Present || !v.Matches {
			t.Errorf("row %+v: want present and matching", v)
		}
		lines = append(lines, r.Columns()...)
	}
	// Five frontends, three of them Local with endpoints elsewhere: eight
	// virtual servers, as Cleanup counts them.
	if len(got.Rows) != 8 {
		t.Errorf("%d rows, want 8:\n%s", len(got.Rows), strings.Join(lines, "\n"))
	}
	want := "198.51.100.10:443/TCP from this node (virtual server fwmark "
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, want) && strings.HasSuffix(l, "matches -> 10.244.0.1:8080 10.244.1.2:8080")
	}) {
		t.Errorf("no row %q... sending to both endpoints:\n%s", want, strings.Join(lines, "\n"))
	}
	if !slices.Contains(lines, "198.51.100.10:443/TCP (virtual server 198.51.100.10:443/TCP): matches -> 10.244.0.1:8080") {
		t.Errorf("the Local frontend's own virtual server is not shown with the local endpoint only:\n%s", strings.Join(lines, "\n"))
	}
}

// Every change behind kpr's back is named: a real server gone, a virtual
// server gone, an address unbound, a set member gone, a persistence
// timeout changed.
func TestInspectPortsNamesEveryDivergence(t *testing.T) {
	sp := goldenCases()["local-policy-source-ranges"]
	k, run := programmed(t, sp)
	cluster := addrKey(netipAddr("10.96.0.2"), dataplane.TCP, 443)
	if err := k.DelDest(cluster, dataplane.Backend{Addr: netipAddr("10.244.1.2"), Port: 8080}); err != nil {
		t.Fatal(err)
	}
	ext := addrKey(netipAddr("203.0.113.10"), dataplane.TCP, 443)
	if err := k.DelService(ext); err != nil {
		t.Fatal(err)
	}
	if err := k.DelAddr(netipAddr("198.51.100.11")); err != nil {
		t.Fatal(err)
	}
	if err := k.DelEntry(setName(setClusterIP, false), Entry{Addr: netipAddr("10.96.0.2"), Proto: dataplane.TCP, Port: 443}); err != nil {
		t.Fatal(err)
	}
	lb := addrKey(netipAddr("198.51.100.11"), dataplane.TCP, 443)
	if err := k.UpdateService(Service{Key: lb, Scheduler: DefaultScheduler, Timeout: 60}); err != nil {
		t.Fatal(err)
	}

	got := inspectPorts(t, k, run, sp)
	for _, want := range []string{
		"10.96.0.2:443/TCP: virtual server 10.96.0.2:443/TCP sends to [10.244.0.1:8080], kpr wants [10.244.0.1:8080 10.244.1.2:8080]",
		"203.0.113.10:443/TCP: no virtual server 203.0.113.10:443/TCP",
		"198.51.100.11 is not bound to " + DeviceName,
		"ipset KPR-CLUSTER-IP lacks 10.96.0.2,tcp:443",
		"198.51.100.11:443/TCP: virtual server 198.51.100.11:443/TCP has a persistence timeout of 60s, kpr wants 0s",
	} {
		if !slices.ContainsFunc(got.Divergences, func(d string) bool { return strings.HasPrefix(d, want) }) {
			t.Errorf("divergences lack %q:\n%s", want, strings.Join(got.Divergences, "\n"))
		}
	}
	states := map[string]string{}
	for _, r := range got.Rows {
		v := r.(VirtualServer)
		states[v.Frontend] = r.Columns()[0]
	}
	if s := states["203.0.113.10:443/TCP"]; !strings.HasSuffix(s, "MISSING") {
		t.Errorf("the deleted virtual server's row is %q, want MISSING", s)
	}
	if s := states["10.96.0.2:443/TCP"]; !strings.HasSuffix(s, "DIFFERS: sends to 10.244.0.1:8080") {
		t.Errorf("the changed virtual server's row is %q, want DIFFERS with what it holds", s)
	}
}

// A Local frontend whose node traffic no rule marks is named: it gets the
// outside's virtual server.
func TestInspectPortsNamesAnUnmarkedLocalFrontend(t *testing.T) {
	sp := goldenCases()["local-policy-source-ranges"]
	k, run := programmed(t, sp)
	// As iptables -t nat -F KPR-IPVS-INTERNAL by hand.
	flush := "*nat\n:" + chainInternal + " - [0:0]\nCOMMIT\n"
	if _, err := run.Run("iptables-nft-restore", []string{"--noflush"}, []byte(flush)); err != nil {
		t.Fatal(err)
	}
	got := inspectPorts(t, k, run, sp)
	if !slices.ContainsFunc(got.Divergences, func(d string) bool {
		return strings.HasPrefix(d, "198.51.100.10:443/TCP: the node's own traffic") && strings.Contains(d, chainInternal)
	}) {
		t.Errorf("divergences lack the unmarked Local frontend:\n%s", strings.Join(got.Divergences, "\n"))
	}
}

// The node's fill counts kpr's virtual servers (not another program's),
// real servers, addresses, set members and rules.
func TestInspectNodeCountsKprsState(t *testing.T) {
	sp := goldenCases()["local-policy-source-ranges"]
	k, run := programmed(t, sp)
	if err := k.AddService(Service{Key: addrKey(netipAddr("192.0.2.1"), dataplane.TCP, 80), Scheduler: "wlc"}); err != nil {
		t.Fatal(err)
	}
	in, err := newInspector(k, run, inspectFamilies)
	if err != nil {
		t.Fatal(err)
	}
	secs := in.InspectNode()
	if len(secs) != 1 || secs[0].Key != "ipvs" {
		t.Fatalf("InspectNode = %+v, want one ipvs section", secs)
	}
	fill := map[string]int{}
	for _, r := range secs[0].Rows {
		f := r.(Fill)
		fill[f.Table] = f.Entries
	}
	for table, want := range map[string]int{
		"virtual servers":            8,
		"real servers":               12,
		"addresses on " + DeviceName: 4,
		"ipset KPR-CLUSTER-IP":       1,
		"ipset KPR-EXTERNAL-LOCAL":   4,
		"ipset KPR-LOAD-BALANCER-FW": 2,
		"ipset KPR-6-CLUSTER-IP":     0,
	} {
		if got, ok := fill[table]; !ok || got != want {
			t.Errorf("%s: %d (%v), want %d; all: %v", table, got, ok, want, fill)
		}
	}
	if fill["IPv4 nat rules in KPR-IPVS-* chains"] == 0 || fill["IPv4 filter rules in KPR-IPVS-* chains"] == 0 {
		t.Errorf("no rules counted: %v", fill)
	}
}

// The IPVS mode's leftovers go only where it recorded writing, and with
// them the record; the kernel is not even opened without one.
func TestRemoveLeftoversOnlyWhereRecorded(t *testing.T) {
	root := filepath.Join(t.TempDir(), "bpf")
	sp := goldenCases()["local-policy-source-ranges"]
	k, run := programmed(t, sp)
	opened := 0
	open := func() (Kernel, func(), error) { opened++; return k, func() {}, nil }
	got, err := removeLeftovers(root, "", open, run)
	if err != nil || got.Found || opened != 0 {
		t.Fatalf("without a record: %+v, %v, kernel opened %d times; want nothing done", got, err, opened)
	}
	if err := Record(root, ""); err != nil {
		t.Fatal(err)
	}
	got, err = removeLeftovers(root, "", open, run)
	if err != nil || !got.Found || got.Count != 8 {
		t.Fatalf("with a record: %+v, %v; want found, 8 virtual servers", got, err)
	}
	if svcs, _ := k.Services(); len(svcs) != 0 || k.device {
		t.Errorf("after the removal: virtual servers %v, device %v; want none", svcs, k.device)
	}
	if got, err = removeLeftovers(root, "", open, run); err != nil || got.Found {
		t.Errorf("a second removal = %+v, %v; want nothing to do: the record went with the state", got, err)
	}
}
