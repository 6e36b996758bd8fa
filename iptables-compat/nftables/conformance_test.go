package nftables

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The nftables backend over knftables' fake passes the dataplane
// conformance suite. The observer walks the fake's table
// (observe_test.go), so it sees what the rules do.
func TestConformance(t *testing.T) {
	dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
		fake := knftables.NewFake(Family, TableName)
		return conformanceBackend(t, fake, func() (snapshot, error) { return snapshotOf(fake), nil })
	})
}

// conformanceBackend is a Plane over nft, with a failure injector
// between them; Restart builds a second Plane over the same table. read
// reads the table back for the observer.
func conformanceBackend(t *testing.T, nft knftables.Interface, read func() (snapshot, error)) dataplanetest.Backend {
	failing := &failingNFT{Interface: nft}
	plane, err := New(Options{NFT: failing, Families: bothFamilies, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return dataplanetest.Backend{
		Dataplane: plane,
		Served: func() (dataplanetest.State, error) {
			s, err := read()
			if err != nil {
				return nil, err
			}
			return s.observed()
		},
		Restart:   func() dataplanetest.Backend { return conformanceBackend(t, nft, read) },
		Tamper:    tamperer{nft: nft},
		FailWrite: failing.failAt,
		Tables:    conformanceTables,
	}
}

// conformanceTables are every kind of table the Plane writes: kpr's
// nftables table, whose chains, sets and maps no Service can fill. The
// affinity sets are the packets' to fill, and have no size limit.
var conformanceTables = []dataplanetest.Table{
	{Name: "nftables chains, sets and maps", Unbounded: "the kernel has no limit on chains, sets or map elements but memory"},
}

// optionsWriters says, for each field of Options, what it writes.
var optionsWriters = map[string][]string{
	"NFT":        {"nftables chains, sets and maps"},
	"Families":   nil, // which families' rules and maps
	"Conntrack":  nil, // deletes conntrack entries only
	"Masquerade": nil,
	"Metrics":    nil, // counts failed transactions
	"Log":        nil,
}

func TestConformanceWalksEveryTableThePlaneWrites(t *testing.T) {
	dataplanetest.CheckWriters(t, conformanceTables, "Options", dataplanetest.MemberNames(reflect.TypeOf(Options{})), optionsWriters)
}

// failingNFT fails the n-th transaction from the last failAt call: a
// transaction is the Plane's unit of writing.
type failingNFT struct {
	knftables.Interface
	mu       sync.Mutex
	n, count int
	err      error
}

func (f *failingNFT) failAt(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n, f.count, f.err = n, 0, err
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.mu.Lock()
	f.count++
	fail := f.n > 0 && f.count == f.n
	err := f.err
	f.mu.Unlock()
	if fail {
		return fmt.Errorf("nft: %w", err)
	}
	return f.Interface.Run(ctx, tx)
}

// tamperer changes kpr's table with transactions of its own, as another
// program on the node would.
type tamperer struct{ nft knftables.Interface }

func keyOf(k dataplanetest.Key) []string {
	return []string{k.Addr.Unmap().String(), netfilter.ProtoName(k.Protocol), strconv.Itoa(int(k.Port))}
}

// Remove deletes k from every map.
func (tp tamperer) Remove(k dataplanetest.Key) error {
	ctx := context.Background()
	tx := tp.nft.NewTransaction()
	want := strings.Join(keyOf(k), " . ")
	for _, base := range []string{mapServiceIPs, mapNoEndpoints, mapNoLocalEndpoints, mapFirewallIPs} {
		m := mapOf(base, netfilter.FamilyOf(k.Addr))
		els, err := tp.nft.ListElements(ctx, "map", m)
		if err != nil {
			return err
		}
		for _, e := range els {
			if strings.Join(e.Key, " . ") == want {
				tx.Delete(&knftables.Element{Map: m, Key: e.Key})
			}
		}
	}
	if err := tp.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("tamper: remove %s: %w", k, err)
	}
	return nil
}

// Redirect plants chains of its own, named like a ServicePort's so that
// only a full sync knows to delete them, and a rule at the head of the
// services chain that sends k to them.
func (tp tamperer) Redirect(k dataplanetest.Key, backends []dataplane.Backend) error {
	fam := netfilter.FamilyOf(k.Addr)
	word := addrWord(fam)
	proto := netfilter.ProtoName(k.Protocol)
	svc := objectName(prefixService, "tamper "+k.String(), "tamper")
	tx := tp.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: svc})
	var vmap []string
	for i, b := range backends {
		ep := objectName(prefixEndpoint, "tamper "+k.String()+b.String(), "tamper")
		tx.Add(&knftables.Chain{Name: ep})
		tx.Add(&knftables.Rule{Chain: ep, Rule: "meta l4proto " + proto + " dnat " + word + " to " + dnatTarget(b)})
		vmap = append(vmap, strconv.Itoa(i)+" : goto "+ep)
	}
	if len(vmap) > 0 {
		tx.Add(&knftables.Rule{Chain: svc, Rule: "numgen random mod " + strconv.Itoa(len(vmap)) + " vmap { " + strings.Join(vmap, " , ") + " }"})
	}
	tx.Add(&knftables.Chain{Name: chainServices})
	tx.Insert(&knftables.Rule{Chain: chainServices,
		Rule: word + " daddr " + k.Addr.Unmap().String() + " " + proto + " dport " + strconv.Itoa(int(k.Port)) + " goto " + svc})
	if err := tp.nft.Run(context.Background(), tx); err != nil {
		return fmt.Errorf("tamper: redirect %s: %w", k, err)
	}
	return nil
}
