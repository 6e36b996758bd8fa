package ebpfplane

import (
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

var _ dataplane.DriftChecker = (*Plane)(nil)

// driftCheckEntries is how many map entries one step of a drift check
// reads and compares: on the order of a millisecond of work, so that an
// update arriving during a check waits at most that long.
const driftCheckEntries = 1024

// StartDriftCheck starts a stepwise check of the maps (maps.DriftScan). It
// runs on the sync loop's goroutine like every other call on the Plane, so
// the LB's bookkeeping is never used from two goroutines.
func (p *Plane) StartDriftCheck() dataplane.DriftCheck {
	return &driftCheck{p: p, scan: p.lb.StartDriftScan()}
}

type driftCheck struct {
	p    *Plane
	scan *maps.DriftScan
}

func (c *driftCheck) Step() (done, held bool, err error) {
	done, inSync, err := c.scan.Step(driftCheckEntries)
	if !done || err != nil {
		return done, false, err
	}
	// After a failed call only Reconcile can vouch for the maps, even if
	// they did not drift.
	return true, inSync && c.p.trusted, nil
}
