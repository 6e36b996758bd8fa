package ebpfplane

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
)

// Plane drives the BPF maps. Like maps.LB it has one writer: the sync loop.
//
// It relies on the contract that no two ServicePorts it is handed share a
// frontend (dataplane.Claims sees to that), so each map entry set belongs
// to exactly one ServicePort.
type Plane struct {
	lb  *maps.LB
	log *zap.Logger
	// held is, per ServicePort, the state its map entries were last
	// written from: what the maps hold for it. For a refused ServicePort
	// it is what they held before the refusal (or it is absent). Dropped
	// frontends and removed UDP backends are found by comparing with it.
	held map[dataplane.ServicePortName]*dataplane.ServicePort
	// trusted is set while every call since the last complete Reconcile
	// succeeded, so that held and the refusals are all the maps hold.
	// ServicePorts are never modified once handed over, so an unchanged
	// pointer means an unchanged ServicePort.
	trusted bool
	// refused are the ServicePorts that did not fit in the maps, with
	// their latest desired state: the maps keep what they held for them
	// before (or nothing), and every later call that frees room, and every
	// Reconcile, tries them again. refusedMu guards it for Refused.
	refusedMu sync.Mutex
	refused   map[dataplane.ServicePortName]refusal
	// term destroys connected UDP sockets of removed backends; nil when
	// the kernel cannot (see SetSocketTerminator). removed collects what
	// one call removed, for one pass of term.
	term    SocketTerminator
	removed []dataplane.RemovedBackend
	// metrics, when set, get the maps' fill levels after every call.
	metrics *metrics.Metrics
	// maglev, when set, repairs the Maglev tables the LB writes
	// (maglev.go).
	maglev *maps.Maglev
}

// SocketTerminator destroys the connected UDP sockets kpr translated to
// backends that have left their frontend (sockterm.Terminator).
type SocketTerminator interface {
	Terminate(removed []dataplane.RemovedBackend) (destroyed int, err error)
}

// SetSocketTerminator makes every Apply and Reconcile that removes backends
// from UDP frontends destroy the connected sockets still sending to them,
// once the maps serve the new backends (so the reconnect finds a live one).
// All backends one call removes are handled in one pass.
func (p *Plane) SetSocketTerminator(t SocketTerminator) { p.term = t }

// PublishMapUsage makes the Plane set m's map fill-level gauges now and
// after every Apply and Reconcile, so that operators see a map filling up
// before Services are refused.
func (p *Plane) PublishMapUsage(m *metrics.Metrics) {
	p.metrics = m
	p.publish()
}

func (p *Plane) publish() {
	if p.metrics == nil {
		return
	}
	for _, u := range p.usage() {
		p.metrics.MapEntries.WithLabelValues(u.Map).Set(float64(u.Entries))
		p.metrics.MapMaxEntries.WithLabelValues(u.Map).Set(float64(u.MaxEntries))
	}
}

// usage is the fill level of every map the LB writes that a ServicePort
// can lack room in.
func (p *Plane) usage() []maps.MapUsage {
	return append(p.lb.Usage(), p.lb.SourceRanges().Usage())
}

// finish ends every call: it hands the backends that left UDP frontends to
// the terminator and publishes the fill levels. The terminator's failures
// are logged: the maps are already right, and a socket it missed only
// keeps the old behaviour.
func (p *Plane) finish(err error) error {
	if err != nil {
		p.trusted = false
	}
	p.publish()
	removed := p.removed
	p.removed = nil
	if len(removed) == 0 {
		return err
	}
	// The tc programs' flows first: they need no kernel support beyond
	// the map, and the sockets' reconnects below start afresh anyway.
	if n, ctErr := p.lb.DeleteUDPFlows(removed); ctErr != nil {
		p.log.Warn("deleting tc conntrack entries of removed UDP backends failed in part; those flows move once they expire",
			zap.Int("removedBackends", len(removed)), zap.Int("flowsDeleted", n), zap.Error(ctErr))
	} else if n > 0 {
		p.log.Debug("deleted tc conntrack entries of removed UDP backends", zap.Int("removedBackends", len(removed)), zap.Int("flowsDeleted", n))
	}
	if p.term == nil {
		return err
	}
	start := time.Now()
	n, termErr := p.term.Terminate(removed)
	fields := []zap.Field{zap.Int("removedBackends", len(removed)), zap.Int("socketsDestroyed", n),
		zap.Duration("took", time.Since(start))}
	if termErr != nil {
		p.log.Warn("destroying UDP sockets of removed backends failed in part", append(fields, zap.Error(termErr))...)
	} else {
		p.log.Debug("destroyed UDP sockets of removed backends", fields...)
	}
	return err
}

// refusal is one refused ServicePort.
type refusal struct {
	sp  *dataplane.ServicePort
	err error
	// flags are the map size flags that would make it fit; a refusal is
	// logged again only when they change, not on every retry.
	flags string
}

// New returns a Plane over lb. It knows nothing of what lb holds, so the
// first call must be a Reconcile listing every ServicePort.
func New(lb *maps.LB, log *zap.Logger) *Plane {
	if log == nil {
		log = zap.NewNop()
	}
	return &Plane{lb: lb, log: log,
		held:    map[dataplane.ServicePortName]*dataplane.ServicePort{},
		refused: map[dataplane.ServicePortName]refusal{}}
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
	if sp == nil {
		return nil
	}
	affinity := dataplane.AffinitySeconds(sp.AffinityTimeout)
	// Sized once; duplicates are found by a scan, as a ServicePort has
	// few frontends (expand runs for every ServicePort of a full sync).
	n := len(sp.Frontends)
	for _, fe := range sp.Frontends {
		if fe.ExternalBackends != nil {
			n++
		}
	}
	out := make([]maps.Service, 0, n)
	add := func(fe dataplane.Frontend, scope maps.Scope, backends []dataplane.Backend) {
		key := vipKey(fe, scope)
		for i := range out {
			if out[i].VIPKey == key {
				return
			}
		}
		out = append(out, maps.Service{VIPKey: key, Kind: fe.Kind, AffinityTimeout: affinity, Backends: backends,
			SourceRanges: sp.SourceRangesFor(fe)})
	}
	for _, fe := range sp.Frontends {
		add(fe, maps.ScopeInternal, fe.Backends)
		if fe.ExternalBackends != nil {
			add(fe, maps.ScopeExternal, fe.ExternalBackends)
		}
	}
	return out
}

func vipKey(fe dataplane.Frontend, scope maps.Scope) maps.VIPKey {
	return maps.VIPKey{VIP: maps.VIP{Addr: fe.Addr.Unmap(), Port: fe.Port, Proto: fe.Protocol}, Scope: scope}
}

// Apply writes the given ServicePorts; nil deletes one. A ServicePort that
// does not fit is refused alone (see Refused); the others are written.
func (p *Plane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	before := p.usage()
	names := dataplane.SortedNames(changes)
	err := p.write(changes, names, wantedBy(changes, names))
	if err == nil && p.freedRoom(before) {
		err = p.retryRefused()
	}
	return p.finish(err)
}

// freedRoom reports whether any map the refused ServicePorts could lack
// room in holds fewer entries than it did at before: only then can a
// refused one fit now (Reconcile retries them regardless).
func (p *Plane) freedRoom(before []maps.MapUsage) bool {
	if len(p.refused) == 0 {
		return false
	}
	for i, u := range p.usage() {
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
	names := dataplane.SortedNames(sps)
	return p.write(sps, names, wantedBy(sps, names))
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
		return p.finish(fmt.Errorf("read BPF maps for reconcile: %w", err))
	}
	if inSync && p.holds(all) {
		// The common case: nothing changed anywhere, except that room
		// may have been made for what was refused.
		err := p.retryRefused()
		p.syncMaglevAll()
		return p.finish(err)
	}
	if !inSync {
		p.log.Info("BPF maps differ from what kpr wrote; re-reading them to repair the difference")
		if err := p.lb.Resync(); err != nil {
			return p.finish(fmt.Errorf("read BPF maps for reconcile: %w", err))
		}
	}
	p.refusedMu.Lock()
	for name := range p.refused {
		if all[name] == nil {
			delete(p.refused, name) // deleted while refused
		}
	}
	p.refusedMu.Unlock()
	// What all does not list goes, and write compares the rest with the
	// maps themselves, so a held made wrong by a failure does no harm.
	names := dataplane.SortedNames(all)
	wanted := wantedBy(all, names)
	for name := range p.held {
		if all[name] == nil {
			delete(p.held, name)
		}
	}
	// Anything in the maps that nobody wants is stale, including entries
	// adopted from before a restart. The frontends a listed ServicePort
	// dropped are left to write, which deletes them only once the rest of
	// that ServicePort is written: a failed write leaves it wholly old.
	dropped := map[maps.VIPKey]bool{}
	for name, sp := range all {
		if sp != nil {
			for _, svc := range expand(p.held[name]) {
				dropped[svc.VIPKey] = true
			}
		}
	}
	var stale []maps.VIPKey
	for _, key := range p.lb.Keys() {
		if !wanted[key] && !dropped[key] {
			stale = append(stale, key)
		}
	}
	var errs []error
	if len(stale) > 0 {
		p.log.Info("removing stale services from the maps", zap.Int("frontends", len(stale)))
		removed := p.servedUDP(stale)
		if err := p.lb.Delete(stale...); err != nil {
			errs = append(errs, err)
		} else {
			p.removed = append(p.removed, removed...)
		}
	}
	p.trusted = true
	errs = append(errs, p.write(all, names, wanted))
	// Ranges of frontends nobody has any more, adopted from before a
	// restart or left by a failed call: their masters are gone by now.
	errs = append(errs, p.lb.RemoveUnaskedRanges())
	p.syncMaglevAll()
	return p.finish(errors.Join(errs...))
}

// holds reports whether all is exactly what the calls so far handed over,
// ServicePort for ServicePort, and the maps hold it (or refused it).
func (p *Plane) holds(all map[dataplane.ServicePortName]*dataplane.ServicePort) bool {
	if !p.trusted {
		return false
	}
	n := 0
	for name, sp := range all {
		if sp == nil {
			continue
		}
		if p.held[name] != sp && p.refused[name].sp != sp {
			return false
		}
		n++
	}
	held := len(p.held)
	for name := range p.refused {
		if _, ok := p.held[name]; !ok {
			held++
		}
	}
	return n == held
}

// writeChunk is how many ServicePorts write upserts at a time.
const writeChunk = 512

// wantedBy returns every entry set that the ServicePorts names of sps ask
// for.
func wantedBy(sps map[dataplane.ServicePortName]*dataplane.ServicePort, names []dataplane.ServicePortName) map[maps.VIPKey]bool {
	wanted := make(map[maps.VIPKey]bool, len(names))
	for _, name := range names {
		for _, svc := range expand(sps[name]) {
			wanted[svc.VIPKey] = true
		}
	}
	return wanted
}

// write brings the maps to sps (nil: delete) for the names given, in that
// order, which is the order in which they get room when not all fit: it
// upserts what differs, then deletes the entries of frontends they
// dropped. A ServicePort that does not fit is refused whole, keeps what
// the maps held for it, and is recorded in refused; that is not an error.
// wanted is wantedBy(sps, names): a frontend one of them dropped is not
// deleted when another now has it.
func (p *Plane) write(sps map[dataplane.ServicePortName]*dataplane.ServicePort, names []dataplane.ServicePortName, wanted map[maps.VIPKey]bool) error {
	// removed is, per ServicePort, the UDP backends its write removes:
	// learnt before the write, kept only if the write succeeds.
	removed := map[dataplane.ServicePortName][]dataplane.RemovedBackend{}
	var errs []error
	failed := map[dataplane.ServicePortName]bool{}
	// The upserts go a chunk of names at a time, in order: a first sync
	// or full reconcile hands over every ServicePort of the cluster, and
	// the upsert groups of all of them at once were a large part of kpr's
	// peak memory. No two ServicePorts share an entry set (the contract),
	// so a chunk's writes change nothing another chunk compares.
	for start := 0; start < len(names); start += writeChunk {
		chunk := names[start:min(len(names), start+writeChunk)]
		var groups [][]maps.Service
		var groupNames []dataplane.ServicePortName
		for _, name := range chunk {
			var upserts []maps.Service
			for _, svc := range expand(sps[name]) {
				if !p.lb.Matches(svc) {
					upserts = append(upserts, svc)
				}
			}
			if len(upserts) > 0 {
				groups = append(groups, upserts)
				groupNames = append(groupNames, name)
			}
			if r := p.removedBy(name, sps[name]); len(r) > 0 {
				removed[name] = r
			}
		}
		for i, err := range p.lb.UpsertGroups(groups) {
			if err == nil {
				continue
			}
			name := groupNames[i]
			failed[name] = true
			var full *maps.MapFullError
			if errors.As(err, &full) && sps[name] != nil {
				p.refuse(name, sps[name], expand(sps[name]), full)
				continue
			}
			errs = append(errs, err)
		}
	}
	// The entries of frontends a written ServicePort no longer has.
	var stale []maps.VIPKey
	for _, name := range names {
		if failed[name] {
			continue
		}
		for _, svc := range expand(p.held[name]) {
			if !wanted[svc.VIPKey] {
				stale = append(stale, svc.VIPKey)
			}
		}
	}
	if err := p.lb.Delete(stale...); err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		if failed[name] {
			continue
		}
		if len(p.refused) > 0 { // only this goroutine writes refused
			p.programmed(name, sps[name] != nil)
		}
		if sps[name] == nil {
			delete(p.held, name)
		} else {
			p.held[name] = sps[name]
		}
		p.removed = append(p.removed, removed[name]...)
	}
	return errors.Join(errs...)
}

// removedBy returns the UDP backends that writing next for name takes
// away from the sockets on this node: compared with what the maps were
// last written from, or, for a ServicePort this Plane has not written
// (after a restart), with what the maps serve its frontends.
func (p *Plane) removedBy(name dataplane.ServicePortName, next *dataplane.ServicePort) []dataplane.RemovedBackend {
	if old, ok := p.held[name]; ok {
		return dataplane.RemovedUDPBackends(old, next)
	}
	if next == nil {
		return nil
	}
	var keys []maps.VIPKey
	for _, fe := range next.Frontends {
		keys = append(keys, vipKey(fe, maps.ScopeInternal))
	}
	served := p.servedUDP(keys)
	if len(served) == 0 { // the common case: not UDP, or nothing served yet
		return nil
	}
	stays := map[dataplane.RemovedBackend]bool{}
	for _, fe := range next.Frontends {
		for _, b := range fe.Backends {
			stays[dataplane.RemovedBackend{Frontend: netip.AddrPortFrom(fe.Addr.Unmap(), fe.Port), Backend: netip.AddrPortFrom(b.Addr.Unmap(), b.Port)}] = true
		}
	}
	var out []dataplane.RemovedBackend
	for _, r := range served {
		if !stays[r] {
			out = append(out, r)
		}
	}
	return out
}

// servedUDP lists the (frontend, backend) pairs the maps serve to sockets
// on this node for the UDP ones of keys.
func (p *Plane) servedUDP(keys []maps.VIPKey) []dataplane.RemovedBackend {
	var out []dataplane.RemovedBackend
	for _, key := range keys {
		if key.Proto != dataplane.UDP || key.Scope != maps.ScopeInternal {
			continue
		}
		svc, ok := p.lb.Get(key)
		if !ok {
			continue
		}
		fe := dataplane.Frontend{Addr: key.Addr, Port: key.Port, Protocol: key.Proto, Backends: svc.Backends}
		out = append(out, dataplane.RemovedUDPBackends(&dataplane.ServicePort{Frontends: []dataplane.Frontend{fe}}, nil)...)
	}
	return out
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
