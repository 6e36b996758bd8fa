package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// rulesResult is the part of `kpr explain -o json` that the iptables mode
// fills in.
type rulesResult struct {
	Dataplane string `json:"dataplane"`
	Rules     []struct {
		Frontend string   `json:"frontend"`
		Jump     string   `json:"jump"`
		Backends []string `json:"backends"`
	} `json:"rules"`
	MapsError   string   `json:"mapsError"`
	Divergences []string `json:"divergences"`
}

// explainArgs are the flags explain needs to find this fixture's daemon
// and dataplane (kprCommand adds --bpf-root).
func (f *fixture) explainArgs(target string, extra ...string) []string {
	return append([]string{"explain", target, "--kubeconfig", f.cluster.KubeconfigPath, "--hostname-override", nodeName,
		"--host-netns", f.node.NetNS.Path}, extra...)
}

// TestExplainIPTables: in the iptables mode, `kpr explain` reads the
// node's rules back and shows where each frontend's rules lead; a
// KUBE-SEP chain flushed by hand is named as a divergence, with the rule
// it lacks. (The IPVS mode has no KUBE-SEP chains to read back: what
// explain shows of it is not this test's.)
func TestExplainIPTables(t *testing.T) {
	forEachMode(t, []dataMode{modeIPTablesNFT}, func(t *testing.T, m dataMode) {
		// The periodic reconcile would repair the rules before explain looks.
		f := newModeFixture(t, m, "--sync-period", "10m")
		ns := f.namespace(t, "explain-iptables")
		svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
		f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
		vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
		podB := netip.AddrPortFrom(f.pod("pod-b").IPv4, tcpPort).String()
		want := []string{netip.AddrPortFrom(f.pod("pod-a").IPv4, tcpPort).String(), podB}
		slices.Sort(want)

		explain := func() rulesResult {
			t.Helper()
			out := f.kprCommand(t, f.explainArgs(ns+"/web", "-o", "json")...)
			var r rulesResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("parse kpr explain output: %v\n%s", err, out)
			}
			return r
		}
		backendsOf := func(r rulesResult) []string {
			for _, rule := range r.Rules {
				if rule.Frontend == vip.String()+"/TCP" {
					return rule.Backends
				}
			}
			return nil
		}
		waitUntil(t, convergeTimeout, "kpr explain reads the Service's rules", func() error {
			r := explain()
			if r.Dataplane != "iptables" || r.MapsError != "" || len(r.Divergences) > 0 || !slices.Equal(backendsOf(r), want) {
				return fmt.Errorf("%+v", r)
			}
			return nil
		})

		// kpr status shows the rules' size where the eBPF mode shows map fill.
		var st struct {
			Daemon *struct {
				Mode string `json:"mode"`
			} `json:"daemon"`
			Rules []struct {
				Family string `json:"family"`
				Chains int    `json:"chains"`
				Rules  int    `json:"rules"`
			} `json:"rules"`
		}
		out, _ := f.kprStatus(t, f.statusArgs("-o", "json")...)
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatal(err)
		}
		if st.Daemon == nil || st.Daemon.Mode != "iptables" || len(st.Rules) == 0 || st.Rules[0].Family != "IPv4" || st.Rules[0].Rules == 0 {
			t.Errorf("kpr status in the iptables mode: daemon %+v, rules %+v; want the mode and kpr's IPv4 rules counted", st.Daemon, st.Rules)
		}

		// By hand: the chain of pod-b's endpoint flushed, as an operator
		// with iptables -F could.
		sep := ""
		for _, l := range strings.Split(f.iptablesSave(t, false), "\n") {
			if strings.HasPrefix(l, "-A KUBE-SEP-") && strings.Contains(l, "--to-destination "+podB) {
				sep = strings.Fields(l)[1]
			}
		}
		if sep == "" {
			t.Fatalf("no KUBE-SEP chain DNATs to %s:\n%s", podB, f.iptablesSave(t, false))
		}
		if _, err := f.inNode("iptables-"+m.variant, nil, "-t", "nat", "-F", sep); err != nil {
			t.Fatal(err)
		}
		r := explain()
		named := slices.ContainsFunc(r.Divergences, func(d string) bool {
			return strings.HasPrefix(d, "IPv4 nat "+sep+" lacks the rule: ") && strings.Contains(d, "--to-destination "+podB)
		})
		if !named {
			t.Errorf("divergences %q: want the DNAT rule of %s that %s lacks", r.Divergences, podB, sep)
		}
		if got := backendsOf(r); slices.Contains(got, podB) {
			t.Errorf("the rules of %s reach %v after %s was flushed; want %s gone", vip, got, sep, podB)
		}
		table := string(f.kprCommand(t, f.explainArgs(ns+"/web")...))
		if !strings.Contains(table, "DIVERGENCE: IPv4 nat "+sep+" lacks the rule") {
			t.Errorf("kpr explain table does not name the divergence:\n%s", table)
		}
		t.Logf("kpr explain %s/web:\n%s", ns, table)
	})
}
