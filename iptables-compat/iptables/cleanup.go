package iptables

import (
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Cleanup removes what the backend writes from the tables of the network
// namespace r runs in: the base jumps in the built-in chains, the shared
// chains and every per-ServicePort chain, in both variants and both
// families wherever their binaries run (see netfilter.RemoveChains). The
// names are kube-proxy's (see names.go), so kube-proxy's own iptables-mode
// chains go too, as under `kube-proxy --cleanup`. It returns how many
// chains it deleted. KUBE-FIREWALL, which the kubelet writes too, stays,
// as under `kube-proxy --cleanup`.
func Cleanup(r netfilter.Runner) (int, error) {
	return netfilter.RemoveChains(r, tables, func(table, chain string) bool {
		return ownSharedChain(table, chain) || ownedChain(chain)
	})
}
