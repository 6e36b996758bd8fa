package watcher

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/health"
)

// objectSource is the read side of the informer caches. The sync only reads
// through it, so tests can feed the sync from plain maps.
type objectSource interface {
	// Service returns the Service key, or false if it does not exist (or is
	// filtered out by the label selectors).
	Service(key serviceName) (*v1.Service, bool)
	// Slices returns every EndpointSlice labelled with the Service's name.
	Slices(key serviceName) []*discoveryv1.EndpointSlice
	// ServiceNames lists every Service.
	ServiceNames() []serviceName
}

type servicePorts = map[dataplane.ServicePortName]*dataplane.ServicePort

// portList is one Service's ServicePorts as translate returned them, each
// name once (desired drops duplicate ports). The dataplane is handed
// pointers into it, which stay the same as long as the translation is
// cached. A slice rather than a map by name because nearly every Service
// has one port: a Go map of one entry still allocates a group of eight
// slots, over 500 bytes per Service here, while the names are already in
// the ServicePorts.
type portList []dataplane.ServicePort

// get returns the ServicePort called name, or nil.
func (l portList) get(name dataplane.ServicePortName) *dataplane.ServicePort {
	for i := range l {
		if l[i].Name == name {
			return &l[i]
		}
	}
	return nil
}

// noLocalCount is one Service's contribution to
// sync_proxy_rules_no_local_endpoints_total. Only these two numbers are
// kept per Service, not the per-port facts they are counted from.
type noLocalCount struct{ internal, external int }

// computed is the desired state of one Service.
type computed struct {
	ports   portList
	noLocal noLocalCount
	// families are the Service's IP families, those its noLocal counts in.
	families familySet
	// healthCheck is set for Services with externalTrafficPolicy: Local
	// and a healthCheckNodePort.
	healthCheck *health.Service
}

// syncer turns dirty Services into dataplane calls. It remembers what the
// dataplane holds so that a partial sync sends only real differences. It is
// used from the sync loop's goroutine only.
type syncer struct {
	src  objectSource
	node func() desired.Node
	dp   dataplane.Dataplane
	log  *zap.Logger

	// applied is what the dataplane holds per Service, as of the last
	// successful Apply or Reconcile. A failed call leaves it untouched.
	// The no-local counts are kept beside the ports, in one map: a second
	// map keyed by Service would repeat the 10,000s of keys.
	applied map[serviceName]appliedState
	// healthChecks is the healthCheckNodePort state per Service, as of the
	// last successful sync.
	healthChecks map[serviceName]health.Service
	// noLocalTotal is the sum of applied's noLocal in each family of
	// metrics.Families (a dual-stack Service counts in both), kept
	// current on every commit.
	noLocalTotal [2]noLocalCount
	// heldPorts is the number of ServicePorts in applied, kept current
	// on every commit: kpr status says how much the dataplane serves.
	heldPorts int
	// problems are the translation problems last logged per Service, so
	// that a bad object is logged when it turns bad, not on every sync.
	problems map[serviceName]map[desired.Problem]bool

	// translated caches each Service's last translation with the object
	// versions it came from, for translatedWith's node. Translation is a
	// pure function of those, so a periodic full reconcile reuses it for
	// every Service that did not change instead of translating 10,000
	// Services again while updates wait.
	translated     map[serviceName]translation
	translatedWith desired.Node

	// claims gives each frontend to one ServicePort before the dataplane
	// sees them (the contract: no two ServicePorts share a frontend).
	claims *dataplane.Claims

	// written sums up what the dataplane took since takeWritten.
	written writeSummary
}

// appliedState is what the dataplane holds for one Service.
type appliedState struct {
	ports    portList
	noLocal  noLocalCount
	families familySet
}

// translation is a cached compute result and what it was computed from.
type translation struct {
	versions string
	c        computed
}

func newSyncer(src objectSource, node func() desired.Node, dp dataplane.Dataplane, log *zap.Logger) *syncer {
	return &syncer{
		src: src, node: node, dp: dp, log: log,
		applied:      map[serviceName]appliedState{},
		healthChecks: map[serviceName]health.Service{},
		problems:     map[serviceName]map[desired.Problem]bool{},
		translated:   map[serviceName]translation{},
		claims:       dataplane.NewClaims(),
	}
}

// useNode drops every cached translation when the node's facts changed.
func (s *syncer) useNode(node desired.Node) {
	if !equalNode(node, s.translatedWith) {
		clear(s.translated)
		s.translatedWith = node
	}
}

// objectVersions identifies the exact objects a translation reads. eps
// must be sorted by name.
func objectVersions(svc *v1.Service, eps []*discoveryv1.EndpointSlice) string {
	// Grown to the exact length once: the string is kept per Service, and
	// a builder growing by doubling would keep up to twice its length.
	n := len(svc.UID) + len(svc.ResourceVersion)
	for _, slice := range eps {
		n += 2 + len(slice.Name) + len(slice.ResourceVersion)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(string(svc.UID))
	b.WriteString(svc.ResourceVersion)
	for _, slice := range eps {
		b.WriteByte('/')
		b.WriteString(slice.Name)
		b.WriteByte('@')
		b.WriteString(slice.ResourceVersion)
	}
	return b.String()
}

// partial recomputes the Services in cs (every Service if cs.all), and
// applies the ServicePorts that differ from what the dataplane holds: new or
// changed ones with their new state, vanished ones as nil. It returns the
// number of ServicePorts passed to Apply.
func (s *syncer) partial(cs changeSet) (int, error) {
	keys := cs.services
	if cs.all {
		// Every Service the API has, plus the ones deleted since the last
		// sync, which only applied still knows.
		keys = make(map[serviceName]*pendingChange, len(s.applied))
		for key := range s.applied {
			keys[key] = nil
		}
		for _, key := range s.src.ServiceNames() {
			keys[key] = nil
		}
	}
	node := s.node()
	s.useNode(node)
	next := make(map[serviceName]computed, len(keys))
	changes := servicePorts{}
	for key := range keys {
		c := s.compute(key, node)
		next[key] = c
		old := s.applied[key].ports
		for i := range c.ports {
			if sp := &c.ports[i]; !desired.Equal(old.get(sp.Name), sp) {
				changes[sp.Name] = sp
			}
		}
		for i := range old {
			if name := old[i].Name; c.ports.get(name) == nil {
				changes[name] = nil
			}
		}
	}
	if len(changes) > 0 {
		resolved, conflicts := s.claims.Resolve(changes, s.appliedPort)
		s.logConflicts(conflicts)
		err := s.dp.Apply(resolved)
		s.claims.Done(err == nil)
		if err != nil {
			return 0, fmt.Errorf("apply %d changed service ports: %w", len(changes), err)
		}
		s.written.add(changes)
	}
	for key, c := range next {
		s.commit(key, c)
	}
	return len(changes), nil
}

// full recomputes every Service and hands the complete state to
// Reconcile, which also repairs drift and removes Services the dataplane
// holds but the API no longer has. It returns the number of ServicePorts.
func (s *syncer) full() (int, error) {
	node := s.node()
	s.useNode(node)
	// What each Service computed to is not kept aside until the commit:
	// compute leaves it in s.translated (or nothing there, for a Service
	// that is gone or not proxied), and keys, sorted, says which Services
	// the API has. At 10,000 Services a map of the results was a MB of
	// the first sync's peak.
	keys := s.src.ServiceNames()
	slices.SortFunc(keys, compareServiceNames)
	all := make(servicePorts, len(keys))
	for _, key := range keys {
		c := s.compute(key, node)
		for i := range c.ports {
			all[c.ports[i].Name] = &c.ports[i]
		}
	}
	resolved, conflicts := s.claims.ResolveAll(all)
	s.logConflicts(conflicts)
	err := s.dp.Reconcile(resolved)
	s.claims.Done(err == nil)
	if err != nil {
		return 0, fmt.Errorf("reconcile all %d service ports: %w", len(all), err)
	}
	s.written.addAll(all)
	inAPI := func(key serviceName) bool {
		_, found := slices.BinarySearchFunc(keys, key, compareServiceNames)
		return found
	}
	for key := range s.applied {
		if !inAPI(key) {
			s.commit(key, computed{})
		}
	}
	for _, key := range keys {
		s.commit(key, s.translated[key].c)
	}
	for key := range s.problems {
		if !inAPI(key) {
			delete(s.problems, key)
		}
	}
	for key := range s.translated {
		if !inAPI(key) {
			delete(s.translated, key)
		}
	}
	return len(all), nil
}

// compareServiceNames orders Services as dataplane.ServicePortName.Compare
// orders their ports, so that Services are computed in the order their
// ports are resolved and written.
func compareServiceNames(a, b serviceName) int {
	return dataplane.ServicePortName{Namespace: a.Namespace, Name: a.Name}.Compare(
		dataplane.ServicePortName{Namespace: b.Namespace, Name: b.Name})
}

// pass is a periodic full reconcile done in steps, so that changes keep
// being applied while it runs (see runner.run): first the dataplane's own
// stepwise drift check, then every Service recomputed a chunk at a time,
// each chunk applied like a partial sync. Everything runs on the sync
// loop's goroutine; a partial sync between two steps is applied against
// the same s.applied, so the pass and the partial syncs never undo each
// other, and a Service the pass reaches after a partial sync is compared
// with that sync's result.
type pass struct {
	start time.Time
	check dataplane.DriftCheck
	// checked is set once the drift check found the dataplane as handed.
	checked bool
	// keys are every Service the API had when the pass started, and every
	// one the dataplane had: a Service deleted without an event (or whose
	// event was lost) is deleted by the pass. Services created during the
	// pass come with their own events.
	keys []serviceName
	next int
	// ports counts the ServicePorts the pass applied; busy is the time
	// its steps took, longest the longest of them.
	ports         int
	written       writeSummary
	steps         int
	busy, longest time.Duration
}

// passServicesPerStep is how many Services one step of a pass recomputes:
// mostly translation-cache hits, a few hundred microseconds.
const passServicesPerStep = 200

// startPass begins a stepwise full reconcile, or returns nil if the
// dataplane cannot check for drift in steps (then only full does it).
func (s *syncer) startPass(now time.Time) *pass {
	dc, ok := s.dp.(dataplane.DriftChecker)
	if !ok {
		return nil
	}
	keys := s.src.ServiceNames()
	inAPI := make(map[serviceName]bool, len(keys))
	for _, key := range keys {
		inAPI[key] = true
	}
	for key := range s.applied {
		if !inAPI[key] {
			keys = append(keys, key)
		}
	}
	return &pass{start: now, check: dc.StartDriftCheck(), keys: keys}
}

// step does one bounded part of p. Once done, held false means the
// dataplane drifted or cannot vouch for its state: full must run.
func (s *syncer) step(p *pass) (done, held bool, err error) {
	if !p.checked {
		done, held, err := p.check.Step()
		if err != nil {
			return true, false, fmt.Errorf("check the dataplane for drift: %w", err)
		}
		if done && !held {
			return true, false, nil
		}
		p.checked = done
		return false, false, nil
	}
	if p.next < len(p.keys) {
		chunk := p.keys[p.next:min(len(p.keys), p.next+passServicesPerStep)]
		p.next += len(chunk)
		cs := changeSet{services: make(map[serviceName]*pendingChange, len(chunk))}
		for _, key := range chunk {
			cs.services[key] = nil
		}
		n, err := s.partial(cs)
		p.ports += n
		p.written.merge(s.takeWritten())
		if err != nil {
			return true, false, err
		}
		return false, false, nil
	}
	// Unlike full, nothing to prune: compute drops the cached state of a
	// Service it finds gone, and the pass computed every Service the API
	// or the dataplane had when it began (a Service deleted since comes
	// with its own event).
	return true, true, nil
}

// appliedPort returns the desired state of the ServicePort name as of the
// last successful sync, or nil.
func (s *syncer) appliedPort(name dataplane.ServicePortName) *dataplane.ServicePort {
	return s.applied[serviceName{Namespace: name.Namespace, Name: name.Name}].ports.get(name)
}

// logConflicts logs frontends that two Services asked for. A conflict is
// bad input, not a dataplane failure: the sync goes on, so that one bad
// Service neither fails every sync nor marks the node unhealthy.
func (s *syncer) logConflicts(conflicts []dataplane.Conflict) {
	for _, c := range conflicts {
		if c.WinnerKind == dataplane.ClusterIP && c.LoserKind != dataplane.ClusterIP {
			s.log.Warn("another Service used this ClusterIP as its "+c.LoserKind.String()+"; the ClusterIP's own Service takes it back, fix the other Service",
				zap.Stringer("frontend", c.Frontend), zap.Stringer("servedBy", c.Winner), zap.Stringer("refused", c.Loser))
			continue
		}
		s.log.Warn("frontend claimed by two Services; keeping the first, fix the conflicting Services",
			zap.Stringer("frontend", c.Frontend), zap.Stringer("servedBy", c.Winner),
			zap.Stringer("refused", c.Loser), zap.Stringer("refusedKind", c.LoserKind))
	}
}

// commit records c as what the dataplane now holds for key.
func (s *syncer) commit(key serviceName, c computed) {
	old := s.applied[key]
	for i := range s.noLocalTotal {
		if old.families.has(i) {
			s.noLocalTotal[i].internal -= old.noLocal.internal
			s.noLocalTotal[i].external -= old.noLocal.external
		}
		if c.families.has(i) {
			s.noLocalTotal[i].internal += c.noLocal.internal
			s.noLocalTotal[i].external += c.noLocal.external
		}
	}
	if c.healthCheck != nil {
		s.healthChecks[key] = *c.healthCheck
	} else {
		delete(s.healthChecks, key)
	}
	s.heldPorts += len(c.ports) - len(old.ports)
	if len(c.ports) == 0 {
		delete(s.applied, key)
		return
	}
	s.applied[key] = appliedState{ports: c.ports, noLocal: c.noLocal, families: c.families}
}

// compute returns the desired state of one Service; nothing if it does not
// exist or is not proxied.
func (s *syncer) compute(key serviceName, node desired.Node) computed {
	svc, ok := s.src.Service(key)
	if !ok {
		delete(s.problems, key)
		delete(s.translated, key)
		return computed{}
	}
	if skip, reason := desired.SkipService(svc); skip {
		s.log.Debug("Service not proxied", zap.Stringer("service", key), zap.String("reason", reason))
		delete(s.problems, key)
		delete(s.translated, key)
		return computed{}
	}
	var eps []*discoveryv1.EndpointSlice
	for _, slice := range s.src.Slices(key) {
		if skip, _ := desired.SkipSlice(slice); !skip {
			eps = append(eps, slice)
		}
	}
	slices.SortFunc(eps, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	versions := objectVersions(svc, eps)
	if cached, ok := s.translated[key]; ok && cached.versions == versions {
		return cached.c
	}
	ports, facts, problems := desired.Translate(svc, eps, node)
	s.logProblems(key, problems)

	c := computed{ports: ports}
	c.noLocal = countNoLocal(facts)
	c.families = familiesOf(svc)
	c.healthCheck = healthCheckOf(svc, facts)
	s.translated[key] = translation{versions: versions, c: c}
	return c
}

// healthCheckOf returns the health-check state of an externalTrafficPolicy:
// Local Service: its healthCheckNodePort and how many distinct endpoints
// on this node are ready (facts' LocalReady; terminating ones do not count).
func healthCheckOf(svc *v1.Service, facts []desired.PortFacts) *health.Service {
	if svc.Spec.HealthCheckNodePort == 0 || svc.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		return nil
	}
	local := map[netip.Addr]bool{}
	for _, f := range facts {
		for _, addr := range f.LocalReady {
			local[addr] = true
		}
	}
	return &health.Service{Port: svc.Spec.HealthCheckNodePort, LocalEndpoints: len(local)}
}

// logProblems logs the problems of key that were not there last time.
func (s *syncer) logProblems(key serviceName, problems []desired.Problem) {
	if len(problems) == 0 {
		delete(s.problems, key)
		return
	}
	seen := make(map[desired.Problem]bool, len(problems))
	for _, p := range problems {
		if !s.problems[key][p] && !seen[p] {
			s.log.Warn("Ignoring unusable part of a Service", zap.Stringer("service", key),
				zap.String("object", p.Object), zap.String("reason", p.Reason))
		}
		seen[p] = true
	}
	s.problems[key] = seen
}

// countNoLocal counts the ports that have endpoints somewhere but whose
// Local traffic policy finds none on this node, so that their traffic is
// dropped here, as kube-proxy does for
// sync_proxy_rules_no_local_endpoints_total.
func countNoLocal(facts []desired.PortFacts) noLocalCount {
	var n noLocalCount
	for _, f := range facts {
		if f.HasEndpoints && !f.HasInternalEndpoints {
			n.internal++
		}
		if f.HasEndpoints && !f.HasExternalEndpoints {
			n.external++
		}
	}
	return n
}
