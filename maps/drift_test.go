package maps

import "github.com/kpr-io/kpr/bpf"

// driftKinds damages the maps behind the LB's back, one way each, for
// Service a (which has ClientIP affinity and at least two backends): an
// entry missing (found only by counting), an extra one, a changed one, in
// every table. Both ways of checking for drift (InSync and DriftScan) must
// notice every one.
var driftKinds = map[string]func(f *fakeMaps, a Service){
	"slot deleted":   func(f *fakeMaps, a Service) { delete(f.services.data, a.bpfKey(2)) },
	"master deleted": func(f *fakeMaps, a Service) { delete(f.services.data, a.bpfKey(0)) },
	"slot repointed": func(f *fakeMaps, a Service) { f.services.data[a.bpfKey(1)] = bpf.KprSvcValue{BackendId: 77} },
	"master recounted": func(f *fakeMaps, a Service) {
		v := f.services.data[a.bpfKey(0)]
		v.Count = 1
		f.services.data[a.bpfKey(0)] = v
	},
	"stray entry": func(f *fakeMaps, a Service) { f.services.data[svcFor("10.96.0.9", 80).bpfKey(0)] = bpf.KprSvcValue{} },
	"backend changed": func(f *fakeMaps, a Service) {
		id := f.services.data[a.bpfKey(1)].BackendId
		b := f.backends.data[id]
		b.Port++
		f.backends.data[id] = b
	},
	"backend deleted": func(f *fakeMaps, a Service) { delete(f.backends.data, f.services.data[a.bpfKey(2)].BackendId) },
	"backend orphan":  func(f *fakeMaps, a Service) { f.backends.data[999999] = bpf.KprBackend{} },
	"rev-NAT deleted": func(f *fakeMaps, a Service) { delete(f.revNat.data, f.services.data[a.bpfKey(0)].RevNatId) },
	"stray rev-NAT":   func(f *fakeMaps, a Service) { f.revNat.data[999999] = bpf.KprRevNatValue{} },
	"affinity match deleted": func(f *fakeMaps, a Service) {
		master := f.services.data[a.bpfKey(0)]
		delete(f.affinityMatch.data, bpf.KprAffinityMatchKey{BackendId: f.services.data[a.bpfKey(1)].BackendId,
			RevNatId: master.RevNatId, Scope: uint8(a.Scope)})
	},
	"stray affinity match": func(f *fakeMaps, a Service) {
		f.affinityMatch.data[bpf.KprAffinityMatchKey{BackendId: 4242, RevNatId: 1}] = 0
	},
}
