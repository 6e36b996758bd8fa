package nftables

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The Inspector finds the table as the Plane wrote it, and names an
// element someone deleted.
func TestInspectorComparesWithTheRendering(t *testing.T) {
	sps := goldenCases()["loadbalancer-local-policy"]
	fake := knftables.NewFake(Family, TableName)
	p, err := New(Options{NFT: fake, Families: bothFamilies})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(changes(sps...)); err != nil {
		t.Fatal(err)
	}
	inspect := func() dataplane.Inspection {
		in, err := ReadInspector(fake, netfilter.Masquerade{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := in.InspectPorts([]dataplane.ServicePort{*sps[0]})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := inspect()
	if len(got.Divergences) != 0 || len(got.Rows) != 3 {
		t.Fatalf("over the table the Plane wrote: %d rows, divergences %v; want 3 rows, none", len(got.Rows), got.Divergences)
	}
	tx := fake.NewTransaction()
	tx.Delete(&knftables.Element{Map: mapOf(mapServiceIPs, netfilter.IPv4), Key: []string{"198.51.100.30", "tcp", "443"}})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	got = inspect()
	if len(got.Divergences) != 1 || !strings.Contains(got.Divergences[0], "lacks 198.51.100.30 . tcp . 443") {
		t.Fatalf("after the load-balancer IP's element went: divergences %v, want the one element named", got.Divergences)
	}
}

// Cleanup deletes kpr's table whole, and finds nothing the second time.
func TestCleanupDeletesTheTable(t *testing.T) {
	fake := knftables.NewFake(Family, TableName)
	p, err := New(Options{NFT: fake, Families: bothFamilies})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(changes(goldenCases()["session-affinity"]...)); err != nil {
		t.Fatal(err)
	}
	n, err := Cleanup(fake)
	if err != nil || n == 0 {
		t.Fatalf("Cleanup = %d, %v; want the chains counted", n, err)
	}
	if fake.Table != nil {
		t.Fatalf("the table is still there:\n%s", fake.Dump())
	}
	if n, err := Cleanup(fake); err != nil || n != 0 {
		t.Fatalf("second Cleanup = %d, %v; want 0, nil", n, err)
	}
}
