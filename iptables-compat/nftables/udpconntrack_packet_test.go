package nftables

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
	"github.com/kpr-io/kpr/tests/harness"
)

// A resolver keeping one source port is answered by a current endpoint
// soon after every change: after its first datagrams went out
// untranslated, while its server pods cycle, and after a restart during
// which its endpoint left.
func TestPacketsUDPConntrack(t *testing.T) {
	requireRoot(t)
	netfiltertest.CheckUDPConntrack(t, func(t *testing.T, node *harness.Node) dataplane.Dataplane {
		nft, err := Open(node.NetNS.Path)
		if err != nil {
			t.Fatal(err)
		}
		plane, err := New(Options{NFT: nft, Families: bothFamilies, Conntrack: inNetNS{node.NetNS}, Log: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return plane
	})
}
