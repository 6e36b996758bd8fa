package iptables

import (
	"os"
	"testing"

	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/namedns"
)

// requireRoot skips unless the test may create network namespaces: as
// root and not under -short.
func requireRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping under -short: runs iptables inside a network namespace of its own, which needs root")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: runs iptables inside a network namespace of its own; run as root")
	}
}

// newNetNS creates an empty network namespace for the test and returns a
// Runner whose every command runs inside it (ip netns exec), never in the
// test's own namespace.
func newNetNS(t testing.TB) netfilter.Runner {
	t.Helper()
	name := namedns.ForTest(t, "kpr-ipt-")
	return netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", name}}
}

// The conformance suite against the real binaries and kernel tables, of
// both variants, each scenario in a namespace of its own: the observer
// parses what the real iptables-save prints, so it also checks that the
// kernel took every rule as rendered.
func TestConformanceInANetNS(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) {
			dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
				return conformanceBackend(t, newNetNS(t), v, 0)
			})
		})
	}
	// Split as a large write is on iptables-nft: the real binaries must
	// take every part as it comes (KUBE-MARK-MASQ before the chains that
	// jump to it, the deletions after the shared chains).
	t.Run("nft-split", func(t *testing.T) {
		dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
			return conformanceBackend(t, newNetNS(t), netfilter.NFT, 1)
		})
	})
}

// iptables-save respells what kpr writes (match order, /32, MARK options,
// probabilities); the drift check must see through that for every shape of
// rule, or every periodic sync would be a needless full rewrite.
func TestDriftCheckHoldsOverRealTables(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		for name, sps := range goldenCases() {
			t.Run(string(v)+"/"+name, func(t *testing.T) {
				run := newNetNS(t)
				p, err := New(Options{Runner: run, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)}})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Reconcile(changes(sps...)); err != nil {
					t.Fatal(err)
				}
				if held := dataplanetest.DriftCheckHolds(t, p); !held {
					t.Fatal("the drift check finds drift in tables the Plane has just written")
				}
			})
		}
		// KUBE-FIREWALL's negated matches and the kubelet's jumps
		// without a comment, as iptables-save prints them.
		for name, cfg := range protectionCases() {
			t.Run(string(v)+"/"+name, func(t *testing.T) {
				p, err := New(Options{Runner: newNetNS(t), LocalhostNodePorts: cfg.localhostNodePorts, ConntrackTCPLiberal: cfg.tcpLiberal,
					Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)}})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Reconcile(changes(localhostServices()...)); err != nil {
					t.Fatal(err)
				}
				if held := dataplanetest.DriftCheckHolds(t, p); !held {
					t.Fatal("the drift check finds drift in tables the Plane has just written")
				}
			})
		}
	}
}
