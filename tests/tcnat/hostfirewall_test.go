package tcnat

import (
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// The documented choice of docs/tc-dataplane.md ("Which netfilter hooks see
// the traffic") and docs/operations.md ("Host firewalls"): a NodePort flow
// to a backend on another node is translated and redirected at tc, so the
// node's own netfilter rules never see it. An operator's DROP in raw
// PREROUTING, filter INPUT and filter FORWARD, for the NodePort and for the
// backend, stops a connection to a port the node itself serves, and does
// not stop the NodePort. Should a change make netfilter see these packets
// (and so make such rules apply), this test fails and the documents must
// change with it; loadBalancerSourceRanges, the documented way to restrict
// who reaches a Service, is covered by TestLoadBalancerSourceRangesFromOutside.
func TestHostFirewallDoesNotSeeRemoteNodePort(t *testing.T) {
	for _, tool := range []string{"iptables-nft", "ip6tables-nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (Debian's iptables package): %v", tool, err)
		}
	}
	l := newLAN(t, loader.TCOptions{})
	const nodePort, hostPort = 30096, 9100
	peerServerInNode(t, l.node1, hostPort)
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), nodePort)
			backend := l.backendsOf(fe.Addr(), echoPort)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, backend...)
			if who, err := harness.WhoTCP(l.client.NetNS, fe, 3*time.Second); err != nil || who != l.remote.Name {
				t.Fatalf("TCP to %s before the firewall rules: %q, %v; want %s", fe, who, err, l.remote.Name)
			}

			tool := "iptables-nft"
			if fam.v6 {
				tool = "ip6tables-nft"
			}
			for _, port := range []int{nodePort, hostPort} {
				p := strconv.Itoa(port)
				hostFirewall(t, l.node1.NetNS, tool, "-t", "raw", "-A", "PREROUTING", "-p", "tcp", "--dport", p, "-j", "DROP")
				hostFirewall(t, l.node1.NetNS, tool, "-A", "INPUT", "-p", "tcp", "--dport", p, "-j", "DROP")
			}
			hostFirewall(t, l.node1.NetNS, tool, "-A", "FORWARD", "-d", backend[0].Addr().String(), "-j", "DROP")
			t.Cleanup(func() {
				for _, table := range []string{"raw", "filter"} {
					hostFirewall(t, l.node1.NetNS, tool, "-t", table, "-F")
				}
			})

			// The rules are live: the node's own server is cut off.
			host := netip.AddrPortFrom(nodeAddr(fam.v6), hostPort)
			if _, err := askPeer(t, l.client.NetNS, host); err == nil {
				t.Fatalf("the node's own server at %s answered through an INPUT DROP: the firewall rules are not in force", host)
			}
			// The NodePort is not.
			for i := range 3 {
				if who, err := harness.WhoTCP(l.client.NetNS, fe, 3*time.Second); err != nil || who != l.remote.Name {
					t.Fatalf("TCP %d to %s with the host firewall dropping it: %q, %v; want %s, "+
						"since tc redirects the flow past PREROUTING, INPUT and FORWARD (if netfilter now sees it, "+
						"update docs/tc-dataplane.md and docs/operations.md)", i, fe, who, err, l.remote.Name)
				}
			}
		})
	}
}

// hostFirewall runs one iptables command in ns, as an operator's rule on
// that node.
func hostFirewall(t *testing.T, ns *harness.NetNS, tool string, args ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, tool, "-w"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s in %s: %v: %s", tool, strings.Join(args, " "), ns.Name, err, out)
	}
}
