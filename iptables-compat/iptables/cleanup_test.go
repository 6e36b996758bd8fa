package iptables

import (
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// allGolden is every golden case's ServicePorts at once: every shape of
// chain the backend writes.
func allGolden() map[dataplane.ServicePortName]*dataplane.ServicePort {
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for _, sps := range goldenCases() {
		for _, sp := range sps {
			all[sp.Name] = sp
		}
	}
	return all
}

// foreign are rules and a chain of another tool (kubelet's firewall
// chain, a CNI's rule): Cleanup must leave them.
const foreign = `*filter
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m comment --comment "kubelet firewall" -j DROP
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
`

// kprChains are the chains of a save output that Cleanup must remove.
func kprChains(save string) []string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		name, _, _ := strings.Cut(strings.TrimPrefix(l, ":"), " ")
		if strings.HasPrefix(l, ":") && (ownedChain(name) || ownSharedChain(tableNAT, name) || ownSharedChain(tableFilter, name)) {
			out = append(out, name)
		}
	}
	return out
}

// writeAndClean programs every golden ServicePort in both families of v,
// adds the foreign rules, runs Cleanup and returns what each family's
// tables hold afterwards.
func writeAndClean(t *testing.T, r netfilter.Runner, v netfilter.Variant) map[netfilter.Family]string {
	t.Helper()
	p, err := New(Options{Runner: r, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(allGolden()); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if _, err := r.Run(netfilter.ToolsFor(v, fam).Restore, []string{"--noflush"}, []byte(foreign)); err != nil {
			t.Fatal(err)
		}
		out, err := r.Run(netfilter.ToolsFor(v, fam).Save, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(kprChains(string(out))) < 10 {
			t.Fatalf("%s tables hold only chains %v after the sync; the test writes too little", fam, kprChains(string(out)))
		}
	}
	n, err := Cleanup(r)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("Cleanup says it deleted no chain")
	}
	after := map[netfilter.Family]string{}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		out, err := r.Run(netfilter.ToolsFor(v, fam).Save, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		after[fam] = string(out)
	}
	if n, err := Cleanup(r); n != 0 || err != nil {
		t.Errorf("a second Cleanup deleted %d chains, %v; want nothing left to do", n, err)
	}
	return after
}

func checkCleaned(t *testing.T, after map[netfilter.Family]string) {
	t.Helper()
	for fam, save := range after {
		if left := kprChains(save); len(left) > 0 {
			t.Errorf("%s: chains left after Cleanup: %v\n%s", fam, left, save)
		}
		if strings.Contains(save, "KUBE-SERVICES") || strings.Contains(save, "KUBE-POSTROUTING") {
			t.Errorf("%s: jumps left after Cleanup:\n%s", fam, save)
		}
		for _, want := range []string{":KUBE-FIREWALL", "-A INPUT -j KUBE-FIREWALL", "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT"} {
			if !strings.Contains(save, want) {
				t.Errorf("%s: Cleanup removed another tool's %q:\n%s", fam, want, save)
			}
		}
	}
}

func TestCleanupRemovesEveryChainItWrites(t *testing.T) {
	fake := netfiltertest.NewIPTables()
	// Only the nft binaries are installed: legacy is skipped.
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		tools := netfilter.ToolsFor(netfilter.Legacy, fam)
		fake.Missing[tools.Save], fake.Missing[tools.Restore] = true, true
	}
	checkCleaned(t, writeAndClean(t, fake, netfilter.NFT))
}

func TestCleanupInANetNS(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) {
			checkCleaned(t, writeAndClean(t, newNetNS(t), v))
		})
	}
}
