package netfilter_test

import (
	"strings"
	"testing"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// RemoveChains deletes the chains it is given and every rule that jumps to
// them, a base jump with a quoted comment included, and leaves the rest;
// a variant whose binaries are missing is skipped.
func TestRemoveChains(t *testing.T) {
	fake := netfiltertest.NewIPTables()
	for _, fam := range netfilter.Families {
		tools := netfilter.ToolsFor(netfilter.Legacy, fam)
		fake.Missing[tools.Save], fake.Missing[tools.Restore] = true, true
	}
	jump := netfilter.BaseJump{Table: "nat", Chain: "PREROUTING", Match: "-m addrtype --dst-type LOCAL", Comment: "mine, quoted", Target: "MINE"}
	input := netfilter.Restore("nat", func(w netfilter.RestoreInput) {
		w.Declare("MINE")
		w.Declare("MINE-TOO")
		w.Declare("THEIRS")
		w.InsertJump(jump)
		w.Rules([]string{"-A MINE -j MINE-TOO", "-A MINE-TOO -j RETURN", "-A OUTPUT -j THEIRS", "-A THEIRS -j RETURN"})
	})
	if _, err := fake.Run("iptables-nft-restore", []string{"--noflush"}, input); err != nil {
		t.Fatal(err)
	}
	mine := func(table, chain string) bool { return table == "nat" && strings.HasPrefix(chain, "MINE") }
	n, err := netfilter.RemoveChains(fake, []string{"nat", "filter"}, mine)
	if err != nil || n != 2 {
		t.Fatalf("RemoveChains = %d, %v; want the 2 MINE chains deleted", n, err)
	}
	out, err := fake.Run("iptables-nft-save", []string{"-t", "nat"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := netfilter.ParseSave(out)
	if err != nil {
		t.Fatal(err)
	}
	nat := saved["nat"]
	if nat.HasChain("MINE") || nat.HasChain("MINE-TOO") || nat.HasJump(jump) {
		t.Errorf("MINE, MINE-TOO or the jump to MINE are left:\n%s", out)
	}
	if !nat.HasChain("THEIRS") || len(nat.ChainRules("OUTPUT")) != 1 {
		t.Errorf("another tool's chain or its jump went:\n%s", out)
	}
	if n, err := netfilter.RemoveChains(fake, []string{"nat", "filter"}, mine); n != 0 || err != nil {
		t.Errorf("a second RemoveChains = %d, %v; want nothing left to do", n, err)
	}
}

// MissingJumps finds a base jump however iptables-save orders its
// matches, and only one with its comment.
func TestMissingJumps(t *testing.T) {
	jumps := []netfilter.BaseJump{
		{Table: "filter", Chain: "INPUT", Match: "-m conntrack --ctstate NEW", Comment: "a b", Target: "A"},
		{Table: "filter", Chain: "INPUT", Comment: "other", Target: "A"},
		{Table: "nat", Chain: "OUTPUT", Comment: "c", Target: "C"},
	}
	saved, err := netfilter.ParseSave([]byte("*filter\n:INPUT ACCEPT [0:0]\n:A - [0:0]\n" +
		`-A INPUT -m comment --comment "a b" -m conntrack --ctstate NEW -j A` + "\nCOMMIT\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := netfilter.MissingJumps("filter", jumps, saved["filter"])
	if len(got) != 1 || got[0] != jumps[1] {
		t.Errorf("MissingJumps = %v, want the jump with the other comment alone", got)
	}
	if got := netfilter.MissingJumps("filter", jumps, nil); len(got) != 2 {
		t.Errorf("MissingJumps of an unread table = %v, want both filter jumps", got)
	}
}
