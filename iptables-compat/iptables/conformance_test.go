package iptables

import (
	"bytes"
	"fmt"
	"net/netip"
	"reflect"
	"strconv"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// The iptables backend over the in-memory iptables passes the dataplane
// conformance suite. The observer parses what iptables-save prints and
// walks the chains (observe_test.go), so it sees what the rules do.
func TestConformance(t *testing.T) {
	dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
		return conformanceBackend(t, netfiltertest.NewIPTables(), netfilter.NFT, 0)
	})
}

// The same with every nat write split into as many transactions as it
// can be (one ServicePort's chains each), as a large one is on
// iptables-nft: every scenario must come out the same.
func TestConformanceWithSplitWrites(t *testing.T) {
	dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
		return conformanceBackend(t, netfiltertest.NewIPTables(), netfilter.NFT, 1)
	})
}

// conformanceBackend is a Plane over the tables run reaches, with a
// failure injector between them; Restart builds a second Plane over the
// same tables. splitLines, when not 0, replaces the variant's
// Tools.SplitLines.
func conformanceBackend(t *testing.T, run netfilter.Runner, v netfilter.Variant, splitLines int) dataplanetest.Backend {
	failing := &failingRunner{Runner: run}
	tools := map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)}
	if splitLines != 0 {
		for fam, t := range tools {
			t.SplitLines = splitLines
			tools[fam] = t
		}
	}
	plane, err := New(Options{
		Runner:   failing,
		Families: tools,
		Log:      zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return dataplanetest.Backend{
		Dataplane: plane,
		Served:    func() (dataplanetest.State, error) { return observed(run, v) },
		Restart:   func() dataplanetest.Backend { return conformanceBackend(t, run, v, splitLines) },
		Tamper:    tamperer{run: run, v: v},
		FailWrite: failing.failAt,
		Tables:    conformanceTables,
	}
}

// conformanceTables are every kind of table the Plane writes: only the
// rules and chains of nat and filter, which no Service can fill. The
// ClientIP affinity lists of the recent match are the packets' to write,
// and drop their oldest address when full.
var conformanceTables = []dataplanetest.Table{
	{Name: "iptables rules and chains", Unbounded: "the kernel has no limit on rules or chains but memory"},
}

// optionsWriters says, for each field of Options, what it writes; a
// writer added to the Plane later (an ipset, say) fails
// TestConformanceWalksEveryTableThePlaneWrites until its tables are in
// conformanceTables and this map.
var optionsWriters = map[string][]string{
	"Runner":     {"iptables rules and chains"},
	"Families":   nil, // which binaries the Runner runs
	"Conntrack":  nil, // deletes conntrack entries only
	"Masquerade": nil,
	// KUBE-FIREWALL's one fixed rule, and the NodePorts on 127.0.0.1
	// among the ServicePorts' rules.
	"LocalhostNodePorts": {"iptables rules and chains"},
	// Leaves out KUBE-FORWARD's one fixed rule.
	"ConntrackTCPLiberal": nil,
	"Metrics":             nil, // reports what was written
	"Log":                 nil,
}

func TestConformanceWalksEveryTableThePlaneWrites(t *testing.T) {
	dataplanetest.CheckWriters(t, conformanceTables, "Options", dataplanetest.MemberNames(reflect.TypeOf(Options{})), optionsWriters)
}

// tamperer changes the tables with iptables-restore of its own, as
// another program on the node would.
type tamperer struct {
	run netfilter.Runner
	v   netfilter.Variant
}

func (tp tamperer) restore(k dataplanetest.Key, input string) error {
	_, err := tp.run.Run(netfilter.ToolsFor(tp.v, netfilter.FamilyOf(k.Addr)).Restore, []string{"--noflush"}, []byte(input))
	return err
}

// Remove deletes every rule that names k's destination from the shared
// chains of both tables.
func (tp tamperer) Remove(k dataplanetest.Key) error {
	fam := netfilter.FamilyOf(k.Addr)
	for _, table := range []string{tableNAT, tableFilter} {
		text, err := tp.run.Run(netfilter.ToolsFor(tp.v, fam).Save, []string{"-t", table}, nil)
		if err != nil {
			return err
		}
		parsed, err := netfilter.ParseSave(text)
		if err != nil {
			return err
		}
		var in bytes.Buffer
		in.WriteString("*" + table + "\n")
		for _, r := range parsed[table].Rules {
			d, err := parseAddr(netfilter.RuleArg(r, "-d"))
			if err == nil && d == k.Addr && netfilter.RuleArg(r, "--dport") == strconv.Itoa(int(k.Port)) &&
				netfilter.ParseProto(netfilter.RuleArg(r, "-p")) == k.Protocol {
				in.WriteString("-D " + r[1] + " " + netfilter.JoinWords(r[2:]) + "\n")
			}
		}
		in.WriteString("COMMIT\n")
		if err := tp.restore(k, in.String()); err != nil {
			return fmt.Errorf("tamper: remove %s from %s: %w", k, table, err)
		}
	}
	return nil
}

// Redirect plants a chain of its own at the head of nat KUBE-SERVICES that
// sends k to backends, named like a ServicePort's chains so that only a
// full sync knows to delete it.
func (tp tamperer) Redirect(k dataplanetest.Key, backends []dataplane.Backend) error {
	proto := netfilter.ProtoName(k.Protocol)
	svc := prefixClusterPolicy + hash16("tamper "+k.String())
	var in bytes.Buffer
	in.WriteString("*nat\n:" + svc + " - [0:0]\n")
	var rules []string
	for i, b := range backends {
		sep := prefixEndpoint + hash16("tamper "+k.String()+b.String())
		in.WriteString(":" + sep + " - [0:0]\n")
		stat := ""
		if left := len(backends) - i; left > 1 {
			stat = " -m statistic --mode random --probability " + probability(left)
		}
		rules = append(rules, "-A "+svc+stat+" -j "+sep,
			"-A "+sep+" -p "+proto+" -m "+proto+" -j DNAT --to-destination "+netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	for _, r := range rules {
		in.WriteString(r + "\n")
	}
	in.WriteString(fmt.Sprintf("-I %s -d %s -p %s -m %s --dport %d -j %s\nCOMMIT\n", chainServices, k.Addr, proto, proto, k.Port, svc))
	if err := tp.restore(k, in.String()); err != nil {
		return fmt.Errorf("tamper: redirect %s: %w", k, err)
	}
	return nil
}
