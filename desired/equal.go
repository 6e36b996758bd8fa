package desired

import (
	"cmp"
	"slices"

	"github.com/kpr-io/kpr/dataplane"
)

// Equal reports whether two ServicePorts describe the same desired state,
// for the sync's change detection. Two nils are equal; nil and non-nil are
// not. Order matters (Translate sorts everything). A nil and an empty
// Backends are equal, as both mean "reject"; a nil and an empty
// ExternalBackends are not, since nil means "use Backends" and empty means
// "drop external traffic".
func Equal(a, b *dataplane.ServicePort) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Name == b.Name &&
		a.AffinityTimeout == b.AffinityTimeout &&
		a.HealthCheckNodePort == b.HealthCheckNodePort &&
		slices.Equal(a.SourceRanges, b.SourceRanges) &&
		slices.EqualFunc(a.Frontends, b.Frontends, equalFrontends)
}

func equalFrontends(a, b dataplane.Frontend) bool {
	return a.Addr == b.Addr && a.Port == b.Port && a.Protocol == b.Protocol && a.Kind == b.Kind &&
		slices.Equal(a.Backends, b.Backends) &&
		(a.ExternalBackends == nil) == (b.ExternalBackends == nil) &&
		slices.Equal(a.ExternalBackends, b.ExternalBackends)
}

// compareFrontends orders frontends by kind, then address, then port.
func compareFrontends(a, b dataplane.Frontend) int {
	if c := cmp.Compare(a.Kind, b.Kind); c != 0 {
		return c
	}
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	return cmp.Compare(a.Protocol, b.Protocol)
}
