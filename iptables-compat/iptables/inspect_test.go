package iptables

import (
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// The reader follows each frontend to the endpoints its rules DNAT to and
// finds no divergence in tables the Plane wrote; a rule or chain changed
// by hand is named.
func TestInspectReadsWhatThePlaneWrote(t *testing.T) {
	tp := newTestPlane(t)
	web := &dataplane.ServicePort{Name: spn("shop", "web", "http", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.20:80", dataplane.TCP, bes("10.244.0.5:8080", "10.244.1.5:8080"), nil),
		front(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, bes("10.244.0.5:8080", "10.244.1.5:8080"), bes("10.244.0.5:8080")),
	}}
	empty := &dataplane.ServicePort{Name: spn("shop", "empty", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.21:80", dataplane.TCP, nil, nil)}}
	if err := tp.Apply(changes(web, empty)); err != nil {
		t.Fatal(err)
	}
	read := func() *Tables {
		t.Helper()
		tabs, err := ReadTables(Options{Runner: tp.fake, Families: tp.tools})
		if err != nil {
			t.Fatal(err)
		}
		return tabs
	}

	// Both families have the 8 shared chains (KUBE-PROXY-FIREWALL among
	// them) and their fixed rules (KUBE-FORWARD's INVALID drop among them); IPv4
	// also web's KUBE-SVC, KUBE-SVL, KUBE-EXT and 2 KUBE-SEP chains, and
	// the rules of both Services.
	if sizes, want := read().Sizes(), []Size{{"IPv4", 13, 21}, {"IPv6", 8, 8}}; !slices.Equal(sizes, want) {
		t.Errorf("sizes = %+v, want %+v", sizes, want)
	}
	got := read().Inspect(web)
	if len(got.Divergences) != 0 {
		t.Errorf("divergences in tables the Plane wrote: %q", got.Divergences)
	}
	want := []FrontendRules{
		{Frontend: "10.96.0.20:80/TCP", Jump: clusterChain(web.Name), Backends: []string{"10.244.0.5:8080", "10.244.1.5:8080"}},
		{Frontend: "192.168.1.10:30080/TCP", Jump: externalChain(web.Name), Backends: []string{"10.244.0.5:8080", "10.244.1.5:8080"}},
	}
	if !slices.EqualFunc(got.Frontends, want, func(a, b FrontendRules) bool {
		return a.Frontend == b.Frontend && a.Jump == b.Jump && slices.Equal(a.Backends, b.Backends) && a.Rejected == b.Rejected
	}) {
		t.Errorf("frontends = %+v, want %+v", got.Frontends, want)
	}
	if e := read().Inspect(empty); len(e.Frontends) != 1 || !e.Frontends[0].Rejected || e.Frontends[0].Jump != "" || len(e.Divergences) != 0 {
		t.Errorf("Service without endpoints: %+v, want its frontend rejected, no jump, no divergence", e)
	}

	// By hand: the jump to one endpoint's chain deleted from KUBE-SVC-*.
	sep := endpointChain(web.Name, be("10.244.1.5:8080"))
	nat := tp.fake.Tables["iptables"][tableNAT]
	svc := clusterChain(web.Name)
	nat.Rules[svc] = slices.DeleteFunc(nat.Rules[svc], func(r []string) bool { return slices.Contains(r, sep) })
	got = read().Inspect(web)
	if len(got.Divergences) != 1 || !strings.HasPrefix(got.Divergences[0], "IPv4 nat "+svc+" lacks the rule: -A "+svc) ||
		!strings.Contains(got.Divergences[0], "-j "+sep) {
		t.Errorf("after deleting the jump to %s: divergences %q, want the missing rule named", sep, got.Divergences)
	}
	if b := got.Frontends[0].Backends; !slices.Equal(b, []string{"10.244.0.5:8080"}) {
		t.Errorf("ClusterIP backends after the deletion = %v, want only 10.244.0.5:8080", b)
	}

	// By hand: the endpoint's chain flushed and deleted, and a stray rule.
	delete(nat.Rules, sep)
	nat.Order = slices.DeleteFunc(nat.Order, func(c string) bool { return c == sep })
	nat.Rules[svc] = append(nat.Rules[svc], []string{"-m", "comment", "--comment", "stray", "-j", "ACCEPT"})
	got = read().Inspect(web)
	joined := strings.Join(got.Divergences, "\n")
	for _, w := range []string{"nat chain " + sep + " is missing (the endpoint 10.244.1.5:8080)", "nat " + svc + " has a rule kpr does not write: -A " + svc + ` -m comment --comment stray -j ACCEPT`} {
		if !strings.Contains(joined, w) {
			t.Errorf("divergences %q lack %q", got.Divergences, w)
		}
	}
	// The other Service's rules are not this one's.
	if e := read().Inspect(empty); len(e.Divergences) != 0 {
		t.Errorf("divergences of an untouched Service: %q", e.Divergences)
	}
}

// NodePorts on 127.0.0.1 are the reader's only when it is told, as the
// Plane was, that localhost NodePorts are served; told otherwise, it
// names their rules as ones kpr does not write.
func TestInspectFollowsLocalhostNodePorts(t *testing.T) {
	fake := netfiltertest.NewIPTables()
	tools := map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)}
	p, err := New(Options{Runner: fake, Families: tools, LocalhostNodePorts: true})
	if err != nil {
		t.Fatal(err)
	}
	web := localhostServices()[0]
	if err := p.Reconcile(changes(web)); err != nil {
		t.Fatal(err)
	}
	for _, localhost := range []bool{true, false} {
		tabs, err := ReadTables(Options{Runner: fake, Families: tools, LocalhostNodePorts: localhost})
		if err != nil {
			t.Fatal(err)
		}
		got := tabs.Inspect(web)
		served := slices.ContainsFunc(got.Frontends, func(f FrontendRules) bool { return f.Frontend == "127.0.0.1:30080/TCP" })
		if served != localhost || (len(got.Divergences) == 0) != localhost {
			t.Errorf("read with localhost NodePorts %v: frontends %+v, divergences %q; want 127.0.0.1 read and no divergence only when they are served",
				localhost, got.Frontends, got.Divergences)
		}
	}
}
