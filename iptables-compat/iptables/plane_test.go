package iptables

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

type testPlane struct {
	*Plane
	fake    *netfiltertest.IPTables
	failing *failingRunner
	ct      *recordingCleaner
}

func newTestPlane(t *testing.T) testPlane {
	return newTestPlaneOn(t, netfiltertest.NewIPTables())
}

// newTestPlaneOn is a Plane over the tables of fake, as a restarted kpr
// finds those of the process before it.
func newTestPlaneOn(t *testing.T, fake *netfiltertest.IPTables) testPlane {
	failing := &failingRunner{Runner: fake}
	ct := &recordingCleaner{}
	p, err := New(Options{Runner: failing, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv6)},
		Conntrack: ct, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return testPlane{Plane: p, fake: fake, failing: failing, ct: ct}
}

func (tp testPlane) served(t *testing.T) dataplanetest.State {
	t.Helper()
	s, err := observed(tp.fake, netfilter.NFT)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type recordingCleaner struct {
	calls []netfilter.UDPFrontends
	err   error
}

func (c *recordingCleaner) DeleteStaleUDP(served netfilter.UDPFrontends) (int, error) {
	c.calls = append(c.calls, served)
	return len(served), c.err
}

func changes(sps ...*dataplane.ServicePort) map[dataplane.ServicePortName]*dataplane.ServicePort {
	out := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for _, sp := range sps {
		out[sp.Name] = sp
	}
	return out
}

func dualStack(v4, v6 []dataplane.Backend) *dataplane.ServicePort {
	return &dataplane.ServicePort{Name: spn("shop", "dual", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.60:80", dataplane.TCP, v4, nil),
		front(dataplane.ClusterIP, "[fd00:10:96::60]:80", dataplane.TCP, v6, nil)}}
}

// A ServicePort spans the tables of both families, each written in a
// transaction of its own. When the IPv6 nat table fails, the IPv4 tables
// already written are put back: the ServicePort stays wholly old.
func TestFailureInALaterTableUndoesTheEarlierOnes(t *testing.T) {
	tp := newTestPlane(t)
	old := dualStack(bes("10.244.0.1:80"), bes("[fd00:10:244::1]:80"))
	if err := tp.Apply(changes(old)); err != nil {
		t.Fatal(err)
	}
	before := tp.served(t)

	injected := errors.New("injected")
	tp.failing.failAt(2, injected) // IPv4 nat, then IPv6 nat (the filter tables do not change)
	err := tp.Apply(changes(dualStack(bes("10.244.0.2:80"), bes("[fd00:10:244::2]:80"))))
	tp.failing.failAt(0, nil)
	if !errors.Is(err, injected) || !strings.Contains(err.Error(), "IPv6 nat") {
		t.Fatalf("Apply = %v, want the injected failure of the IPv6 nat table", err)
	}
	if got := tp.served(t); !equalState(got, before) {
		t.Fatalf("after the failed Apply the tables serve\n%v\nwant what they served before\n%v", got, before)
	}
}

func equalState(a, b dataplanetest.State) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v.Backends, w.Backends) || v.AffinityTimeout != w.AffinityTimeout {
			return false
		}
	}
	return true
}

// A partial sync declares (and so rewrites) only what changed. An endpoint
// change rewrites the Service's own chains in one transaction, the IPv4 nat
// table's, and leaves the shared chains and the other Service's chains
// alone; a new Service rewrites KUBE-SERVICES whole, with every Service's
// entry.
func TestApplyRewritesOnlyTheChangedServicePortsChains(t *testing.T) {
	tp := newTestPlane(t)
	a := &dataplane.ServicePort{Name: spn("ns", "a", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, bes("10.244.0.1:80"), nil)}}
	b := &dataplane.ServicePort{Name: spn("ns", "b", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.2:80", dataplane.TCP, bes("10.244.0.2:80"), nil)}}
	if err := tp.Apply(changes(a, b)); err != nil {
		t.Fatal(err)
	}
	a2 := &dataplane.ServicePort{Name: a.Name, Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, bes("10.244.0.3:80"), nil)}}
	tp.fake.Inputs = nil
	if err := tp.Apply(changes(a2)); err != nil {
		t.Fatal(err)
	}
	if len(tp.fake.Inputs) != 1 || !strings.HasPrefix(tp.fake.Inputs[0], "*nat") {
		t.Fatalf("an endpoint change ran %d transactions, want one of the nat table:\n%s", len(tp.fake.Inputs), strings.Join(tp.fake.Inputs, "\n"))
	}
	nat := tp.fake.Inputs[0]
	for _, want := range []string{
		":" + clusterChain(a.Name) + " ",
		":" + endpointChain(a.Name, be("10.244.0.3:80")) + " ",
		"-X " + endpointChain(a.Name, be("10.244.0.1:80")),
	} {
		if !strings.Contains(nat, want) {
			t.Errorf("the IPv4 nat transaction lacks %q:\n%s", want, nat)
		}
	}
	for _, unwanted := range []string{":" + chainServices + " ", ":" + clusterChain(b.Name), ":" + endpointChain(b.Name, be("10.244.0.2:80"))} {
		if strings.Contains(nat, unwanted) {
			t.Errorf("the IPv4 nat transaction rewrites an unchanged chain (%q):\n%s", unwanted, nat)
		}
	}
	want := state(serves("10.96.0.1:80", "10.244.0.3:80"), serves("10.96.0.2:80", "10.244.0.2:80"))
	if got := tp.served(t); !equalState(got, want) {
		t.Fatalf("serves %v, want %v", got, want)
	}

	c := &dataplane.ServicePort{Name: spn("ns", "c", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.3:80", dataplane.TCP, bes("10.244.0.4:80"), nil)}}
	tp.fake.Inputs = nil
	if err := tp.Apply(changes(c)); err != nil {
		t.Fatal(err)
	}
	if len(tp.fake.Inputs) != 1 || !strings.Contains(tp.fake.Inputs[0], ":"+chainServices+" ") ||
		!strings.Contains(tp.fake.Inputs[0], "-j "+clusterChain(b.Name)) {
		t.Fatalf("a new Service's transactions do not rewrite KUBE-SERVICES whole:\n%s", strings.Join(tp.fake.Inputs, "\n"))
	}
	want = state(want, serves("10.96.0.3:80", "10.244.0.4:80"))
	if got := tp.served(t); !equalState(got, want) {
		t.Fatalf("serves %v, want %v", got, want)
	}
}

func state(parts ...dataplanetest.State) dataplanetest.State {
	out := dataplanetest.State{}
	for _, p := range parts {
		for k, v := range p {
			out[k] = v
		}
	}
	return out
}

func serves(fe string, backends ...string) dataplanetest.State {
	ap := netip.MustParseAddrPort(fe)
	k := dataplanetest.Key{Addr: ap.Addr(), Port: ap.Port(), Protocol: dataplane.TCP}
	out := dataplanetest.State{}
	for _, tr := range []dataplanetest.Traffic{dataplanetest.Internal, dataplanetest.External} {
		k.Traffic = tr
		out[k] = dataplanetest.Serving{Backends: bes(backends...)}
	}
	return out
}

// A full sync deletes per-ServicePort chains nobody owns (left by an
// earlier process, or by kube-proxy), keeps other programs' chains, and
// puts the base jumps in place once, however often it runs.
func TestReconcileDeletesUnownedChainsAndKeepsOthers(t *testing.T) {
	tp := newTestPlane(t)
	if _, err := tp.fake.Run("iptables-nft-restore", []string{"--noflush"}, []byte(
		"*nat\n:KUBE-SVC-LEFTOVER0000000 - [0:0]\n:KUBE-SEP-LEFTOVER0000000 - [0:0]\n:CNI-MINE - [0:0]\n"+
			"-A KUBE-SVC-LEFTOVER0000000 -j KUBE-SEP-LEFTOVER0000000\n-A CNI-MINE -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	a := &dataplane.ServicePort{Name: spn("ns", "a", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, bes("10.244.0.1:80"), nil)}}
	for range 2 {
		if err := tp.Reconcile(changes(a)); err != nil {
			t.Fatal(err)
		}
	}
	nat := tp.fake.Tables["iptables"]["nat"]
	for _, c := range []string{"KUBE-SVC-LEFTOVER0000000", "KUBE-SEP-LEFTOVER0000000"} {
		if slices.Contains(nat.Order, c) {
			t.Errorf("leftover chain %s survived Reconcile", c)
		}
	}
	if !slices.Contains(nat.Order, "CNI-MINE") || !slices.Contains(nat.Order, clusterChain(a.Name)) {
		t.Errorf("Reconcile removed a chain it should keep; nat chains: %v", nat.Order)
	}
	for _, builtin := range []string{"PREROUTING", "OUTPUT", "POSTROUTING"} {
		if n := len(nat.Rules[builtin]); n != 1 {
			t.Errorf("nat %s has %d rules after two Reconciles, want its one jump: %v", builtin, n, nat.Rules[builtin])
		}
	}
	if n := len(tp.fake.Tables["iptables"]["filter"].Rules["FORWARD"]); n != 4 {
		t.Errorf("filter FORWARD has %d rules, want the 4 base jumps", n)
	}
}

// After a successful write the conntrack entries of UDP backends that left
// The UDP conntrack entries that no longer match the rules are deleted
// after each write that changes a UDP ServicePort, and after the first
// one whatever it changes; a failed write deletes nothing.
func TestConntrackOfRemovedUDPBackends(t *testing.T) {
	tp := newTestPlane(t)
	name := spn("kube-system", "dns", "dns", dataplane.UDP)
	dns := func(backends ...string) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: name, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, bes(backends...), nil)}}
	}
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	servedBy := func(backends ...string) netfilter.UDPFrontends {
		set := map[netip.AddrPort]bool{}
		for _, b := range backends {
			set[netip.MustParseAddrPort(b)] = true
		}
		return netfilter.UDPFrontends{vip: set}
	}
	if err := tp.Apply(changes(dns("10.244.0.10:53", "10.244.1.10:53"))); err != nil {
		t.Fatal(err)
	}
	if want := servedBy("10.244.0.10:53", "10.244.1.10:53"); len(tp.ct.calls) != 1 || !maps.EqualFunc(tp.ct.calls[0], want, maps.Equal) {
		t.Fatalf("the first write compared %v with the kernel's entries, want %v", tp.ct.calls, want)
	}
	tp.failing.failAt(1, errors.New("injected")) // the one transaction: IPv4 nat
	if err := tp.Apply(changes(dns("10.244.1.10:53"))); err == nil {
		t.Fatal("Apply succeeded despite the failed write")
	}
	tp.failing.failAt(0, nil)
	if len(tp.ct.calls) != 1 {
		t.Fatalf("conntrack cleanup ran after a failed write: %v", tp.ct.calls[1:])
	}
	if err := tp.Apply(changes(dns("10.244.1.10:53"))); err != nil {
		t.Fatal(err)
	}
	if want := servedBy("10.244.1.10:53"); len(tp.ct.calls) != 2 || !maps.EqualFunc(tp.ct.calls[1], want, maps.Equal) {
		t.Fatalf("conntrack cleanup got %v, want a second call with %v", tp.ct.calls, want)
	}
	// A write that changes no UDP ServicePort leaves the entries alone.
	if err := tp.Apply(changes(dualStack(bes("10.244.0.60:8080"), nil))); err != nil {
		t.Fatal(err)
	}
	if len(tp.ct.calls) != 2 {
		t.Fatalf("conntrack cleanup ran for a TCP-only write: %v", tp.ct.calls[2:])
	}
	// A failing cleanup does not fail the sync: the rules are right. The
	// Service's frontend is gone, so every entry to it is stale.
	tp.ct.err = errors.New("netlink says no")
	if err := tp.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name: nil}); err != nil {
		t.Fatalf("Apply failed because the conntrack cleanup did: %v", err)
	}
	if want := servedBy(); len(tp.ct.calls) != 3 || !maps.EqualFunc(tp.ct.calls[2], want, maps.Equal) {
		t.Fatalf("conntrack cleanup got %v, want a third call with %v", tp.ct.calls, want)
	}
}

// A failed call leaves tables no drift check can vouch for until a
// Reconcile succeeds, even where the undo put them back.
func TestDriftCheckAfterAFailedCall(t *testing.T) {
	tp := newTestPlane(t)
	sps := goldenCases()["loadbalancer-local-policy"]
	if err := tp.Reconcile(changes(sps...)); err != nil {
		t.Fatal(err)
	}
	if !dataplanetest.DriftCheckHolds(t, tp.Plane) {
		t.Fatal("drift right after a Reconcile")
	}
	tp.failing.failAt(1, errors.New("injected"))
	if err := tp.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sps[0].Name: nil}); err == nil {
		t.Fatal("Apply succeeded despite the failed write")
	}
	tp.failing.failAt(0, nil)
	if dataplanetest.DriftCheckHolds(t, tp.Plane) {
		t.Fatal("the drift check holds after a failed call")
	}
	if err := tp.Reconcile(changes(sps...)); err != nil {
		t.Fatal(err)
	}
	if !dataplanetest.DriftCheckHolds(t, tp.Plane) {
		t.Fatal("drift after the repairing Reconcile")
	}
}

// A write larger than Tools.SplitLines goes in several transactions, none
// holding more than that many lines of per-ServicePort chains, each
// ServicePort's chains in one of them; KUBE-MARK-MASQ comes first, the
// shared chains last, and the tables serve every Service.
func TestLargeWriteGoesInParts(t *testing.T) {
	fake := netfiltertest.NewIPTables()
	tools := netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)
	tools.SplitLines = 100
	p, err := New(Options{Runner: fake, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: tools}, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	want := dataplanetest.State{}
	for i := range 40 {
		sp := dataplanetest.BenchService(i, 0) // 10 endpoints: 21 chain lines
		all[sp.Name] = sp
		var backends []string
		for _, b := range sp.Frontends[0].Backends {
			backends = append(backends, b.String())
		}
		want = state(want, serves(netip.AddrPortFrom(sp.Frontends[0].Addr, 80).String(), backends...))
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	var nat []string
	for _, in := range fake.Inputs {
		if strings.HasPrefix(in, "*nat") {
			nat = append(nat, in)
		}
	}
	if len(nat) < 9 {
		t.Fatalf("840 lines of chains went in %d nat transactions, want at least 9 of at most 100 lines", len(nat))
	}
	if !strings.Contains(nat[0], ":"+chainMarkMasq+" ") || !strings.Contains(nat[len(nat)-1], ":"+chainServices+" ") {
		t.Errorf("KUBE-MARK-MASQ is not in the first part or KUBE-SERVICES not in the last")
	}
	written := map[string]int{}
	for _, in := range nat {
		lines := 0
		for _, l := range strings.Split(in, "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || !ownedChain(strings.TrimPrefix(f[0], ":")) && (len(f) < 2 || !ownedChain(f[1]) || f[0] != "-A") {
				continue
			}
			lines++
			if strings.HasPrefix(f[0], ":") {
				written[f[0]]++
			}
		}
		if lines > 100 {
			t.Errorf("a nat transaction writes %d lines of per-ServicePort chains, more than 100", lines)
		}
	}
	for c, n := range written {
		if n != 1 {
			t.Errorf("chain %s declared in %d transactions, want 1", c, n)
		}
	}
	s, err := observed(fake, netfilter.NFT)
	if err != nil {
		t.Fatal(err)
	}
	if !equalState(s, want) {
		t.Fatalf("after a write in parts the tables serve\n%v\nwant\n%v", s, want)
	}
}

// A drift check reads a table beside the sync loop: a Step returns while
// a slow iptables-save runs, and an Apply meanwhile goes through. The read
// then shows the state after the Apply: it is compared again with that
// state (no second iptables-save), not taken for drift.
func TestDriftCheckDoesNotHoldUpApply(t *testing.T) {
	fake := netfiltertest.NewIPTables()
	gate := &heldSaves{Runner: fake, release: make(chan struct{})}
	p, err := New(Options{Runner: gate, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)}, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(changes(dataplanetest.BenchService(1, 0))); err != nil {
		t.Fatal(err)
	}
	gate.hold.Store(true)
	c := p.StartDriftCheck() // the filter table first
	stepped := make(chan bool)
	go func() {
		done, _, _ := c.Step()
		stepped <- done
	}()
	select {
	case done := <-stepped:
		if done {
			t.Fatal("the check ended while its table was still being read")
		}
	case <-time.After(5 * time.Second):
		close(gate.release)
		t.Fatal("a Step waited for a slow iptables-save: the sync loop would be held up with it")
	}
	// A Service without endpoints: a reject rule in the filter table.
	empty := &dataplane.ServicePort{Name: spn("ns", "empty", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.9.9:80", dataplane.TCP, nil, nil)}}
	if err := p.Apply(changes(empty)); err != nil {
		t.Fatalf("Apply while a table is read: %v", err)
	}
	close(gate.release)
	held, err := dataplanetest.RunDriftCheck(driftCheckOnly{c})
	if err != nil || !held {
		t.Fatalf("the check over tables only the Plane wrote: held %v, err %v (a read overlapped by the Apply taken for drift?)", held, err)
	}
	if n := gate.saves.Load(); n != 2 {
		t.Errorf("the check ran iptables-save %d times, want 2 (filter, nat): the read the Apply overlapped should be compared again, not read again", n)
	}
}

// heldSaves holds every iptables-save while hold is set, until release is
// closed; restores pass at once.
type heldSaves struct {
	netfilter.Runner
	hold    atomic.Bool
	release chan struct{}
	saves   atomic.Int32
}

func (r *heldSaves) Run(name string, args []string, stdin []byte) ([]byte, error) {
	if strings.HasSuffix(name, "-save") && r.hold.Load() {
		r.saves.Add(1)
		<-r.release
	}
	return r.Runner.Run(name, args, stdin)
}

// driftCheckOnly continues a check already begun.
type driftCheckOnly struct{ c dataplane.DriftCheck }

func (d driftCheckOnly) StartDriftCheck() dataplane.DriftCheck { return d.c }

// A rule another program adds to a shared chain the Plane keeps empty
// (filter KUBE-SERVICES when every Service has endpoints) is drift.
func TestDriftCheckSeesARuleInAnEmptySharedChain(t *testing.T) {
	tp := newTestPlane(t)
	if err := tp.Reconcile(changes(dataplanetest.BenchService(1, 0))); err != nil {
		t.Fatal(err)
	}
	if !dataplanetest.DriftCheckHolds(t, tp.Plane) {
		t.Fatal("drift right after a Reconcile")
	}
	if _, err := tp.fake.Run("iptables-nft-restore", []string{"--noflush"},
		[]byte("*filter\n-A KUBE-SERVICES -d 10.96.1.1/32 -p tcp -m tcp --dport 80 -j REJECT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if dataplanetest.DriftCheckHolds(t, tp.Plane) {
		t.Fatal("the drift check holds with a foreign rule in filter KUBE-SERVICES")
	}
}
