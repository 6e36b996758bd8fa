package iptables

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
	"github.com/kpr-io/kpr/tests/harness"
)

// A resolver keeping one source port is answered by a current endpoint
// soon after every change: after its first datagrams went out
// untranslated, while its server pods cycle, and after a restart during
// which its endpoint left.
func TestPacketsUDPConntrack(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) {
			netfiltertest.CheckUDPConntrack(t, func(t *testing.T, node *harness.Node) dataplane.Dataplane {
				plane, err := New(Options{
					Runner: netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", node.NetNS.Name}},
					Families: map[netfilter.Family]netfilter.Tools{
						netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)},
					Conntrack: inNetNS{node.NetNS},
					Log:       zaptest.NewLogger(t),
				})
				if err != nil {
					t.Fatal(err)
				}
				return plane
			})
		})
	}
}
