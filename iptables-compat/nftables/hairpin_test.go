package nftables

import (
	"context"
	"slices"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// hairpinKeys lists the elements of the IPv4 hairpin set.
func hairpinKeys(t *testing.T, nft knftables.Interface) []string {
	t.Helper()
	els, err := nft.ListElements(context.Background(), "set", mapOf(setHairpin, netfilter.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range els {
		out = append(out, normalKey(e.Key))
	}
	slices.Sort(out)
	return out
}

// Two Services that select the same pod share its hairpin element: it
// stays while either holds it, in partial writes and after a full one,
// and goes with the last.
func TestHairpinElementsAreSharedBetweenServicePorts(t *testing.T) {
	fake := knftables.NewFake(Family, TableName)
	p, err := New(Options{NFT: fake, Families: bothFamilies})
	if err != nil {
		t.Fatal(err)
	}
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, bes("10.244.0.5:8080", "10.244.0.6:8080"), nil)}}
	api := &dataplane.ServicePort{Name: spn("shop", "api", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.2:80", dataplane.TCP, bes("10.244.0.5:8080"), nil)}}
	both := []string{"10.244.0.5 . 10.244.0.5 . tcp . 8080", "10.244.0.6 . 10.244.0.6 . tcp . 8080"}

	if err := p.Reconcile(changes(web)); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(changes(api)); err != nil {
		t.Fatal(err)
	}
	if got := hairpinKeys(t, fake); !slices.Equal(got, both) {
		t.Fatalf("after both Services: hairpin set %q, want %q", got, both)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web.Name: nil}); err != nil {
		t.Fatal(err)
	}
	if got, want := hairpinKeys(t, fake), both[:1]; !slices.Equal(got, want) {
		t.Fatalf("after web went: hairpin set %q, want %q (api still DNATs to 10.244.0.5)", got, want)
	}
	if err := p.Reconcile(changes(web, api)); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{api.Name: nil}); err != nil {
		t.Fatal(err)
	}
	if got := hairpinKeys(t, fake); !slices.Equal(got, both) {
		t.Fatalf("after a full write and api going: hairpin set %q, want %q", got, both)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web.Name: nil}); err != nil {
		t.Fatal(err)
	}
	if got := hairpinKeys(t, fake); len(got) != 0 {
		t.Fatalf("after both went: hairpin set %q, want empty", got)
	}
}
