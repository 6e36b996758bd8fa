package kubeproxy

import (
	"slices"
	"testing"
)

func TestKubeProxyChainsSpareTheKubelets(t *testing.T) {
	for _, c := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"nat", "KUBE-SVC-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-SEP-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-LOAD-BALANCER", true},
		{"filter", "KUBE-PROXY-FIREWALL", true},
		{"filter", "KUBE-IPVS-OUT-FILTER", true},
		{"mangle", "KUBE-PROXY-CANARY", true},
		// The kubelet's, which kube-proxy only duplicates.
		{"filter", "KUBE-FIREWALL", false},
		{"mangle", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		// Another tool's.
		{"nat", "CNI-HOSTPORT-DNAT", false},
		{"filter", "KUBE-SVC-LOOKALIKE", false},
	} {
		if got := isKubeProxyChain(c.table, c.chain); got != c.want {
			t.Errorf("isKubeProxyChain(%s, %s) = %v, want %v", c.table, c.chain, got, c.want)
		}
	}
}

func TestTablesNamedPicksTheIPFamilies(t *testing.T) {
	listing := []byte("table ip filter\ntable ip kube-proxy\ntable ip6 kube-proxy\ntable inet kube-proxy\ntable ip kube-proxy-other\n")
	if got := tablesNamed(listing, "kube-proxy"); !slices.Equal(got, []string{"ip", "ip6"}) {
		t.Errorf("tablesNamed = %v, want [ip ip6]", got)
	}
}
