package nftables

import (
	"errors"
	"fmt"
	"testing"

	"go.uber.org/zap/zaptest"
	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
)

type failureCounter map[string]int

func (c failureCounter) SyncFailed(family fmt.Stringer) { c[family.String()]++ }

// A failed transaction counts once in each family the Plane serves (kpr's
// one table holds both), as kube-proxy's per-family proxiers would count
// sync_proxy_rules_nftables_sync_failures_total; a good one counts nothing.
func TestSyncFailuresAreCounted(t *testing.T) {
	failing := &failingNFT{Interface: knftables.NewFake(Family, TableName)}
	counted := failureCounter{}
	p, err := New(Options{NFT: failing, Families: bothFamilies, Metrics: counted, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.10:80", dataplane.TCP, bes("10.244.0.1:80"), nil)}}
	if err := p.Reconcile(changes(web)); err != nil {
		t.Fatal(err)
	}
	if len(counted) != 0 {
		t.Fatalf("failures %v after a good sync", counted)
	}
	injected := errors.New("injected")
	failing.failAt(1, injected)
	web2 := *web
	web2.Frontends = []dataplane.Frontend{front(dataplane.ClusterIP, "10.96.0.10:80", dataplane.TCP, bes("10.244.0.2:80"), nil)}
	if err := p.Apply(changes(&web2)); !errors.Is(err, injected) {
		t.Fatalf("Apply = %v, want the injected failure", err)
	}
	if counted["IPv4"] != 1 || counted["IPv6"] != 1 {
		t.Errorf("failures %v, want one in each family", counted)
	}
}
