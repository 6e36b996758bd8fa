package dataplanetest

import (
	"fmt"
	"net/netip"

	"github.com/kpr-io/kpr/dataplane"
)

// BenchServices are Services 0 to n-1 of BenchService: what the
// backends' benchmarks program, so that their figures compare.
func BenchServices(n int) map[dataplane.ServicePortName]*dataplane.ServicePort {
	all := make(map[dataplane.ServicePortName]*dataplane.ServicePort, n)
	for i := range n {
		sp := BenchService(i, 0)
		all[sp.Name] = sp
	}
	return all
}

// BenchService is Service i with 10 endpoints, as in the head-to-head
// benchmark; generation picks one of three sets of them, so that
// consecutive generations differ.
func BenchService(i, generation int) *dataplane.ServicePort {
	vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
	var backends []dataplane.Backend
	for j := range 10 {
		addr := netip.AddrFrom4([4]byte{10, byte(244 + generation), byte(j), byte(i % 250)})
		backends = append(backends, dataplane.Backend{Addr: addr, Port: 8080})
	}
	return &dataplane.ServicePort{
		Name:      dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Protocol: dataplane.TCP},
		Frontends: []dataplane.Frontend{{Addr: vip, Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP, Backends: backends}},
	}
}
