package ebpfplane

import (
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

// Entries returns the map entries the backend writes for sp, so that
// `kpr explain` compares the maps with exactly what Apply would write.
func Entries(sp *dataplane.ServicePort) []maps.Service { return expand(sp) }
