package watcher

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/metrics"
)

// familySet holds indexes into metrics.Families.
type familySet uint8

func (s familySet) has(i int) bool { return s&(1<<i) != 0 }

// familiesOf is the Service's IP families, as kube-proxy's per-family
// proxiers would each see it: spec.ipFamilies, or, where the API server
// left that empty, the family of its cluster IP (IPv4 without one).
func familiesOf(svc *v1.Service) familySet {
	var s familySet
	add := func(fam string) {
		for i, f := range metrics.Families {
			if f == fam {
				s |= 1 << i
			}
		}
	}
	for _, f := range svc.Spec.IPFamilies {
		add(string(f))
	}
	if s == 0 {
		if a, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil && a.Is6() && !a.Is4In6() {
			add(metrics.IPv6)
		} else {
			add(metrics.IPv4)
		}
	}
	return s
}
