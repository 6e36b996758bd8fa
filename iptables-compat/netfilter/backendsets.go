package netfilter

import (
	"slices"

	"github.com/kpr-io/kpr/dataplane"
)

// FamilyBackends is backends of fam, with IPv4-mapped addresses unmapped,
// sorted and without repeats: the one form in which the iptables and
// nftables modes tell two sets of endpoints apart and render one.
func FamilyBackends(backends []dataplane.Backend, fam Family) []dataplane.Backend {
	var out []dataplane.Backend
	for _, b := range backends {
		if FamilyOf(b.Addr) == fam {
			out = append(out, dataplane.Backend{Addr: b.Addr.Unmap(), Port: b.Port})
		}
	}
	slices.SortFunc(out, dataplane.Backend.Compare)
	return slices.Compact(out)
}

// ServiceChainBackends are the endpoints a ServicePort's service chain
// (KUBE-SVC-*, or nftables' service-*) holds: those of its first frontend
// that is not a ClusterIP, as NodePort, external and load-balancer
// frontends carry the cluster-wide endpoints, or failing one those of its
// first frontend. fes is not empty.
func ServiceChainBackends(fes []dataplane.Frontend) []dataplane.Backend {
	for _, fe := range fes {
		if fe.Kind != dataplane.ClusterIP {
			return fe.Backends
		}
	}
	return fes[0].Backends
}
