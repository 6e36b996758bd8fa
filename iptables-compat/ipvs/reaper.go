package ipvs

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// ReapInterval is how often RunReaper looks for drained real servers, as
// kube-proxy's graceful termination does.
const ReapInterval = time.Minute

// Reap deletes the drained real servers (weight 0, no longer wanted) that
// have no connections left, and returns how many. A drained real server
// that is wanted again is not one: the write that wanted it set its
// weight back.
func (p *Plane) Reap() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0, nil
	}
	deleted := 0
	var errs []error
	for _, k := range sortedServiceKeys(p.cur.services) {
		s := p.cur.services[k]
		draining := false
		for _, d := range s.Dests {
			draining = draining || d.Weight == 0
		}
		if !draining {
			continue
		}
		live, err := p.k.Dests(k)
		if err != nil {
			errs = append(errs, fmt.Errorf("list the real servers of %s: %w", k, err))
			continue
		}
		for _, b := range sortedBackends(s.Dests) {
			if s.Dests[b].Weight != 0 {
				continue
			}
			d, ok := live[b]
			if ok && d.Active+d.Inactive > 0 {
				continue
			}
			if ok {
				if err := p.k.DelDest(k, b); err != nil {
					errs = append(errs, fmt.Errorf("delete drained real server %s of %s: %w", b, k, err))
					continue
				}
			}
			delete(s.Dests, b)
			deleted++
		}
	}
	return deleted, errors.Join(errs...)
}

// RunReaper calls Reap every interval until stop is closed.
func (p *Plane) RunReaper(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			n, err := p.Reap()
			if err != nil {
				p.log.Warn("Could not delete every drained IPVS real server; the next round tries again", zap.Error(err))
			}
			if n > 0 {
				p.log.Debug("Deleted drained IPVS real servers", zap.Int("count", n))
			}
		}
	}
}

func sortedServiceKeys(m map[ServiceKey]*ServiceState) []ServiceKey {
	set := make(map[ServiceKey]bool, len(m))
	for k := range m {
		set[k] = true
	}
	return sortedKeys(set)
}
