package netfilter

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

func TestCountFilterRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		save string
		want int
	}{
		{"empty", "", 0},
		{"no filter table", "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n", 0},
		{"only kube-proxy's and kpr's jumps", `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KPR-FORWARD - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KPR-FORWARD
-A OUTPUT -j DROP
-A KUBE-FIREWALL -j DROP
COMMIT
`, 0},
		{"foreign rules and a drop policy", `*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ufw-before-input - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp -m tcp --dport 30080 -s 10.0.0.0/8 -j ACCEPT
-A INPUT -j ufw-before-input
-A FORWARD -p tcp --dport 30080 -j DROP
-A ufw-before-input -j DROP
COMMIT
`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CountFilterRules([]byte(tc.save))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("CountFilterRules = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCountNFTRules(t *testing.T) {
	// nft -j list ruleset of a node with firewalld-like inet table (two
	// rules in input, one in forward with a drop policy), iptables-nft's
	// own filter table, kube-proxy's nftables table and an output chain.
	ruleset := `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "inet", "name": "fw", "handle": 1}},
{"chain": {"family": "inet", "table": "fw", "name": "in", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
{"chain": {"family": "inet", "table": "fw", "name": "fwd", "handle": 2, "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
{"chain": {"family": "inet", "table": "fw", "name": "out", "handle": 3, "type": "filter", "hook": "output", "prio": 0, "policy": "drop"}},
{"chain": {"family": "inet", "table": "fw", "name": "helper", "handle": 4}},
{"rule": {"family": "inet", "table": "fw", "chain": "in", "handle": 5, "expr": [{"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "in", "handle": 6, "expr": [{"drop": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "fwd", "handle": 7, "expr": [{"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "out", "handle": 8, "expr": [{"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "helper", "handle": 9, "expr": [{"drop": null}]}},
{"table": {"family": "ip", "name": "filter", "handle": 2}},
{"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 2, "expr": [{"drop": null}]}},
{"table": {"family": "ip", "name": "kube-proxy", "handle": 3}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-input", "handle": 1, "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-input", "handle": 2, "expr": [{"drop": null}]}}
]}`
	got, err := CountNFTRules([]byte(ruleset))
	if err != nil {
		t.Fatal(err)
	}
	// in: 2 rules; fwd: 1 rule and its drop policy.
	if got != 4 {
		t.Errorf("CountNFTRules = %d, want 4", got)
	}
	if got, err := CountNFTRules([]byte(`{"nftables": [{"metainfo": {"version": "1.0.6"}}]}`)); err != nil || got != 0 {
		t.Errorf("empty ruleset: CountNFTRules = %d, %v; want 0", got, err)
	}
}

// TestReadHostFirewallInANetNS adds a rule to INPUT with iptables-nft, and
// an nftables table with an input chain, in a network namespace of the
// test's own, and reads them back through a Runner there.
func TestReadHostFirewallInANetNS(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	for _, bin := range []string{"ip", "iptables-nft", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	name := fmt.Sprintf("kpr-fw-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	r := RunnerIn(context.Background(), "/run/netns/"+name)
	if fw := ReadHostFirewall(r); fw.Total() != 0 || len(fw.Errors) > 0 {
		t.Fatalf("a new namespace: %+v, want no rules and no errors", fw)
	}
	for _, cmd := range [][]string{
		{"iptables-nft", "-A", "INPUT", "-p", "tcp", "--dport", "30080", "-j", "DROP"},
		{"iptables-nft", "-N", "KUBE-FIREWALL"},
		{"iptables-nft", "-A", "INPUT", "-j", "KUBE-FIREWALL"},
		{"nft", "add table inet fw; add chain inet fw in { type filter hook input priority 0; policy drop; }; add rule inet fw in tcp dport 30080 accept"},
	} {
		if _, err := r.Run(cmd[0], cmd[1:], nil); err != nil {
			t.Fatal(err)
		}
	}
	fw := ReadHostFirewall(r)
	if len(fw.Errors) > 0 {
		t.Fatalf("errors: %v", fw.Errors)
	}
	// iptables: the DROP rule (the jump to KUBE-FIREWALL is kubelet's);
	// nftables: the rule and the drop policy of inet fw's input chain.
	if fw.IPTables != 1 || fw.NFTables != 2 {
		t.Errorf("ReadHostFirewall = %+v, want 1 iptables rule and 2 nftables rules", fw)
	}
}
