package ebpfplane

import (
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
)

// SetMaglev makes the Plane keep mg's Maglev tables (kpr run --lb-algorithm
// maglev) in step with the Services it writes: the LB writes the tables of
// the frontends it writes (maps/write.go), and every Reconcile repairs all
// of them. A table that cannot be written is logged, not returned: its
// frontend is still served, its new flows picked at random, and the next
// Reconcile tries again.
func (p *Plane) SetMaglev(mg *maps.Maglev) {
	mg.OnError = func(err error) {
		p.log.Warn("writing a Maglev table failed; its frontend picks backends at random until the next reconcile", zap.Error(err))
	}
	mg.OnSparse = func(key maps.VIPKey, backends int, size uint32) {
		p.log.Warn("Maglev table has fewer than 100 slots per backend: flows still pick the same backend on every node, "+
			"but the backends' shares are less even and a backend change moves more flows; raise --maglev-table-size",
			zap.Stringer("frontend", key.VIP), zap.Int("backends", backends), zap.Uint32("tableSize", size),
			zap.Uint64("suggestedAtLeast", uint64(backends)*maglev.SlotsPerBackend))
	}
	p.maglev = mg
}

// syncMaglevAll brings every table to what the maps hold, and removes the
// tables of frontends the maps no longer have.
func (p *Plane) syncMaglevAll() {
	if p.maglev == nil {
		return
	}
	if err := p.maglev.SyncAll(); err != nil {
		p.log.Warn("reconciling Maglev tables failed; the frontends concerned pick backends at random until the next reconcile", zap.Error(err))
	}
}
