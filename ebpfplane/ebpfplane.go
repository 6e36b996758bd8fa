// Package ebpfplane is the eBPF implementation of dataplane.Dataplane: it
// expands each desired ServicePort into one map entry set per frontend and
// scope, and writes only what differs from what the maps already hold.
package ebpfplane

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

// Plane drives the BPF maps. Like maps.LB it has one writer: the sync loop.
type Plane struct {
	lb  *maps.LB
	log *zap.Logger
	// owned records which map entries each ServicePort wrote, so that a
	// frontend a ServicePort no longer has is deleted, and two ServicePorts
	// claiming one frontend are noticed instead of overwriting each other.
	owned map[dataplane.ServicePortName][]maps.VIPKey
	owner map[maps.VIPKey]claimant
	// applied is every ServicePort handed in by the last successful calls:
	// what the maps hold, except for the refused ones; nil when a call
	// failed and the maps may differ. ServicePorts are never modified once
	// handed over, so an unchanged pointer means an unchanged ServicePort.
	applied map[dataplane.ServicePortName]*dataplane.ServicePort
	// refused are the ServicePorts that did not fit in the maps, with
	// their latest desired state: the maps keep what they held for them
	// before (or nothing), and every later call that frees room, and every
	// Reconcile, tries them again. refusedMu guards it for Refused.
	refusedMu sync.Mutex
	refused   map[dataplane.ServicePortName]refusal
	// contested are the entries a claim was refused (or taken over) for
	// since the last Reconcile. handover is set when one of them lost its
	// owner: only a Reconcile hands it to the waiting ServicePort, so until
	// one runs, Reconcile takes its slow path and a drift check reports the
	// maps as not held.
	contested map[maps.VIPKey]bool
	handover  bool
	// term destroys connected UDP sockets of removed backends; nil when
	// the kernel cannot (see SetSocketTerminator).
	term SocketTerminator
}

// SocketTerminator destroys the connected UDP sockets kpr translated to
// backends that have left their frontend (sockterm.Terminator).
type SocketTerminator interface {
	Terminate(removed []maps.RemovedBackend) (destroyed int, err error)
}

// SetSocketTerminator makes every Apply and Reconcile that removes backends
// from UDP frontends destroy the connected sockets still sending to them,
// once the maps serve the new backends (so the reconnect finds a live one).
// All backends one call removes are handled in one pass.
func (p *Plane) SetSocketTerminator(t SocketTerminator) {
	p.term = t
	p.lb.RecordRemovedUDPBackends()
}

// terminate hands the backends that left UDP frontends to the terminator.
// Its failures are logged: the maps are already right, and a socket it
// missed only keeps the old behaviour.
func (p *Plane) terminate() {
	if p.term == nil {
		return
	}
	removed := p.lb.TakeRemovedUDPBackends()
	if len(removed) == 0 {
		return
	}
	start := time.Now()
	n, err := p.term.Terminate(removed)
	fields := []zap.Field{zap.Int("removedBackends", len(removed)), zap.Int("socketsDestroyed", n),
		zap.Duration("took", time.Since(start))}
	if err != nil {
		p.log.Warn("destroying UDP sockets of removed backends failed in part", append(fields, zap.Error(err))...)
		return
	}
	p.log.Debug("destroyed UDP sockets of removed backends", fields...)
}

// refusal is one refused ServicePort.
type refusal struct {
	sp  *dataplane.ServicePort
	err error
	// flags are the map size flags that would make it fit; a refusal is
	// logged again only when they change, not on every retry.
	flags string
}

// claimant is the ServicePort that owns a map entry, and the kind of
// frontend it owns it as.
type claimant struct {
	name dataplane.ServicePortName
	kind dataplane.FrontendKind
}

// New returns a Plane over lb. Until the first Reconcile it knows no
// owners, so that first call must list every ServicePort.
func New(lb *maps.LB, log *zap.Logger) *Plane {
	if log == nil {
		log = zap.NewNop()
	}
	return &Plane{lb: lb, log: log,
		owned:     map[dataplane.ServicePortName][]maps.VIPKey{},
		owner:     map[maps.VIPKey]claimant{},
		refused:   map[dataplane.ServicePortName]refusal{},
		contested: map[maps.VIPKey]bool{}}
}

var (
	_ dataplane.Dataplane = (*Plane)(nil)
	_ dataplane.Refuser   = (*Plane)(nil)
)

// Refused returns the ServicePorts that do not fit in the maps.
func (p *Plane) Refused() map[dataplane.ServicePortName]dataplane.Refusal {
	p.refusedMu.Lock()
	defer p.refusedMu.Unlock()
	out := make(map[dataplane.ServicePortName]dataplane.Refusal, len(p.refused))
	for name, r := range p.refused {
		out[name] = dataplane.Refusal{Reason: dataplane.RefusedMapFull, Message: r.err.Error()}
	}
	return out
}

// expand turns a ServicePort into map entries: every frontend gets its
// internal scope, and an external scope when external traffic has a
// backend set of its own.
func expand(sp *dataplane.ServicePort) []maps.Service {
	affinity := uint32(sp.AffinityTimeout / time.Second)
	var out []maps.Service
	seen := map[maps.VIPKey]bool{}
	add := func(fe dataplane.Frontend, scope maps.Scope, backends []dataplane.Backend) {
		key := maps.VIPKey{VIP: maps.VIP{Addr: fe.Addr.Unmap(), Port: fe.Port, Proto: fe.Protocol}, Scope: scope}
		if seen[key] {
			return
		}
		seen[key] = true
		out = append(out, maps.Service{VIPKey: key, Kind: fe.Kind, AffinityTimeout: affinity, Backends: backends})
	}
	for _, fe := range sp.Frontends {
		add(fe, maps.ScopeInternal, fe.Backends)
		if fe.ExternalBackends != nil {
			add(fe, maps.ScopeExternal, fe.ExternalBackends)
		}
	}
	return out
}

// Apply writes the given ServicePorts; nil deletes one. A ServicePort that
// does not fit is refused alone (see Refused); the others are written.
func (p *Plane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	before := p.lb.Usage()
	want, names := p.claimAll(changes)
	err := p.write(changes, want, names)
	if err == nil && p.freedRoom(before) {
		err = p.retryRefused()
	}
	p.terminate()
	if err != nil || p.applied == nil {
		p.applied = nil
		return err
	}
	for name, sp := range changes {
		if sp == nil {
			delete(p.applied, name)
		} else {
			p.applied[name] = sp
		}
	}
	return nil
}

// claimAll claims the frontends of every ServicePort, in name order so that
// which of two conflicting ServicePorts wins does not depend on map order.
//
// ClusterIPs are claimed first, by every ServicePort, and then the other
// frontends: the API server allocates a ClusterIP to one Service only, so an
// external IP, load-balancer IP or node address equal to it is the other
// Service's mistake and must not take the ClusterIP over, whatever the
// Services are called and whichever came first.
func (p *Plane) claimAll(sps map[dataplane.ServicePortName]*dataplane.ServicePort) (map[dataplane.ServicePortName][]maps.Service, []dataplane.ServicePortName) {
	names := sortedNames(sps)
	want := make(map[dataplane.ServicePortName][]maps.Service, len(sps))
	for _, clusterIPs := range []bool{true, false} {
		for _, name := range names {
			if sps[name] == nil {
				want[name] = nil
				continue
			}
			var these []maps.Service
			for _, svc := range expand(sps[name]) {
				if (svc.Kind == dataplane.ClusterIP) == clusterIPs {
					these = append(these, svc)
				}
			}
			want[name] = append(want[name], p.claim(name, these)...)
		}
	}
	return want, names
}

// freedRoom reports whether any map the refused ServicePorts could lack
// room in holds fewer entries than it did at before: only then can a
// refused one fit now (Reconcile retries them regardless).
func (p *Plane) freedRoom(before []maps.MapUsage) bool {
	if len(p.refused) == 0 {
		return false
	}
	for i, u := range p.lb.Usage() {
		if u.Entries < before[i].Entries {
			return true
		}
	}
	return false
}

// retryRefused tries the refused ServicePorts again; those that still do
// not fit stay refused.
func (p *Plane) retryRefused() error {
	if len(p.refused) == 0 {
		return nil
	}
	sps := make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(p.refused))
	for name, r := range p.refused {
		sps[name] = r.sp
	}
	want, names := p.claimAll(sps)
	return p.write(sps, want, names)
}

// sortedNames returns the names of sps in String() order. Each name's
// string is built once: building both in every comparison made the sort a
// quarter of a full reconcile of 10,000 Services.
func sortedNames(sps map[dataplane.ServicePortName]*dataplane.ServicePort) []dataplane.ServicePortName {
	type keyed struct {
		name dataplane.ServicePortName
		key  string
	}
	all := make([]keyed, 0, len(sps))
	for name := range sps {
		all = append(all, keyed{name, name.String()})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].key < all[j].key })
	names := make([]dataplane.ServicePortName, len(all))
	for i, k := range all {
		names[i] = k.name
	}
	return names
}

// Reconcile re-reads the maps, writes whatever differs from all and
// deletes every entry all does not mention, including entries of
// Services deleted while kpr was down.
func (p *Plane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	// Rebuilding the LB's view costs far more than checking it; rebuild
	// only when the maps drifted (or on the first call after a restart,
	// when the view was built moments ago anyway).
	inSync, err := p.lb.InSync()
	if err != nil {
		return fmt.Errorf("read BPF maps for reconcile: %w", err)
	}
	if inSync && !p.handover && p.holds(all) {
		// The common case: nothing changed anywhere, except that room
		// may have been made for what was refused.
		err := p.retryRefused()
		p.terminate()
		if err != nil {
			p.applied = nil
		}
		return err
	}
	if !inSync {
		p.log.Info("BPF maps differ from what kpr wrote; re-reading them to repair the difference")
		if err := p.lb.Resync(); err != nil {
			return fmt.Errorf("read BPF maps for reconcile: %w", err)
		}
	}
	p.owned = map[dataplane.ServicePortName][]maps.VIPKey{}
	p.owner = map[maps.VIPKey]claimant{}
	p.contested = map[maps.VIPKey]bool{}
	p.handover = false
	p.refusedMu.Lock()
	for name := range p.refused {
		if all[name] == nil {
			delete(p.refused, name) // deleted while refused
		}
	}
	p.refusedMu.Unlock()
	want, names := p.claimAll(all)
	var errs []error
	// Anything in the maps that nobody claimed is stale.
	var stale []maps.VIPKey
	for _, key := range p.lb.Keys() {
		if _, ok := p.owner[key]; !ok {
			stale = append(stale, key)
		}
	}
	if len(stale) > 0 {
		p.log.Info("removing stale services from the maps", zap.Int("frontends", len(stale)))
		if err := p.lb.Delete(stale...); err != nil {
			errs = append(errs, err)
		}
	}
	err = errors.Join(append(errs, p.write(all, want, names))...)
	p.terminate()
	p.applied = nil
	if err == nil {
		p.applied = make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(all))
		for name, sp := range all {
			if sp != nil {
				p.applied[name] = sp
			}
		}
	}
	return err
}

// holds reports whether all is exactly what the last successful calls
// handed over, ServicePort for ServicePort.
func (p *Plane) holds(all map[dataplane.ServicePortName]*dataplane.ServicePort) bool {
	if p.applied == nil {
		return false
	}
	n := 0
	for name, sp := range all {
		if sp == nil {
			continue
		}
		if p.applied[name] != sp {
			return false
		}
		n++
	}
	return n == len(p.applied)
}

// claim drops the entries another ServicePort already owns and records the
// rest as name's. A conflict is bad input, not a dataplane failure: it is
// logged, the first owner keeps the frontend, and the sync goes on (failing
// it would retry forever and mark the node unhealthy over one bad Service).
// The next full reconcile hands the frontend over if its owner goes away.
// The one exception: a ClusterIP takes its frontend from an earlier owner
// that has it as another kind (see claimAll).
func (p *Plane) claim(name dataplane.ServicePortName, svcs []maps.Service) []maps.Service {
	kept := svcs[:0]
	for _, svc := range svcs {
		if other, ok := p.owner[svc.VIPKey]; ok && other.name != name {
			p.contested[svc.VIPKey] = true
			if svc.Kind != dataplane.ClusterIP || other.kind == dataplane.ClusterIP {
				p.log.Warn("frontend claimed by two Services; keeping the first, fix the conflicting Services",
					zap.Stringer("frontend", svc.VIPKey.VIP), zap.Stringer("servedBy", other.name),
					zap.Stringer("refused", name), zap.Stringer("refusedKind", svc.Kind))
				continue
			}
			p.log.Warn("another Service used this ClusterIP as its "+other.kind.String()+"; the ClusterIP's own Service takes it back, fix the other Service",
				zap.Stringer("frontend", svc.VIPKey.VIP), zap.Stringer("servedBy", name), zap.Stringer("refused", other.name))
		}
		p.owner[svc.VIPKey] = claimant{name: name, kind: svc.Kind}
		kept = append(kept, svc)
	}
	return kept
}

// write upserts what differs, then deletes frontends ServicePorts dropped,
// and records ownership for what the maps now hold. sps are the
// ServicePorts want was expanded from, names want's keys in the order in
// which they get room when not all fit. A ServicePort that does not fit is
// refused whole and recorded in refused; that is not an error.
func (p *Plane) write(sps map[dataplane.ServicePortName]*dataplane.ServicePort,
	want map[dataplane.ServicePortName][]maps.Service, names []dataplane.ServicePortName) error {
	var groups [][]maps.Service
	var groupNames []dataplane.ServicePortName
	wanted := map[maps.VIPKey]bool{}
	for _, name := range names {
		var upserts []maps.Service
		for _, svc := range want[name] {
			wanted[svc.VIPKey] = true
			if !p.lb.Matches(svc) {
				upserts = append(upserts, svc)
			}
		}
		if len(upserts) > 0 {
			groups = append(groups, upserts)
			groupNames = append(groupNames, name)
		}
	}
	var errs []error
	failed := map[dataplane.ServicePortName]bool{}
	for i, err := range p.lb.UpsertGroups(groups) {
		if err == nil {
			continue
		}
		name := groupNames[i]
		failed[name] = true
		var full *maps.MapFullError
		if errors.As(err, &full) && sps[name] != nil {
			p.refuse(name, sps[name], want[name], full)
			continue
		}
		errs = append(errs, err)
	}
	if len(p.refused) > 0 { // only this goroutine writes refused
		for _, name := range names {
			if !failed[name] {
				p.programmed(name, sps[name] != nil)
			}
		}
	}
	var stale []maps.VIPKey
	for name := range want {
		for _, key := range p.owned[name] {
			if !wanted[key] && p.owner[key].name == name {
				stale = append(stale, key)
			}
		}
	}
	if err := p.lb.Delete(stale...); err != nil {
		errs = append(errs, err)
	}
	for _, key := range stale {
		delete(p.owner, key)
		p.handover = p.handover || p.contested[key]
	}
	// A refused entry stays owned: the maps hold its old content or
	// nothing, it is retried (a failed write makes the sync retry), and a
	// later delete of the ServicePort still removes it.
	for name, svcs := range want {
		keys := make([]maps.VIPKey, 0, len(svcs))
		for _, svc := range svcs {
			keys = append(keys, svc.VIPKey)
		}
		if len(keys) == 0 {
			delete(p.owned, name)
		} else {
			p.owned[name] = keys
		}
	}
	return errors.Join(errs...)
}

// refuse records that sp does not fit, and logs it when it newly does not
// or now needs other maps to grow.
func (p *Plane) refuse(name dataplane.ServicePortName, sp *dataplane.ServicePort, svcs []maps.Service, full *maps.MapFullError) {
	var flags []string
	for _, s := range full.Short {
		flags = append(flags, s.Flag)
	}
	r := refusal{sp: sp, flags: strings.Join(flags, ",")}
	// What the maps still hold of it tells the operator what clients see.
	served := false
	for _, svc := range svcs {
		if _, ok := p.lb.Get(svc.VIPKey); ok {
			served = true
		}
	}
	if served {
		r.err = fmt.Errorf("%w; until then its previous state stays in the maps", full)
	} else {
		r.err = fmt.Errorf("%w; until then it is not served on this node", full)
	}
	p.refusedMu.Lock()
	old, was := p.refused[name]
	p.refused[name] = r
	p.refusedMu.Unlock()
	if !was || old.flags != r.flags {
		p.log.Warn("Service port does not fit in the BPF maps: refused it alone, every other Service is still served; it is programmed once room is made",
			zap.Stringer("servicePort", name), zap.Error(r.err))
	}
}

// programmed records that name is no longer refused: its desired state is
// in the maps (exists) or it was deleted.
func (p *Plane) programmed(name dataplane.ServicePortName, exists bool) {
	p.refusedMu.Lock()
	_, was := p.refused[name]
	delete(p.refused, name)
	p.refusedMu.Unlock()
	if was && exists {
		p.log.Info("Service port refused earlier for lack of map room now fits and is programmed", zap.Stringer("servicePort", name))
	}
}
