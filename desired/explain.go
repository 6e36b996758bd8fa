package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
)

// Explanation says how Translate turned one Service into ServicePorts: for
// every endpoint of its EndpointSlices whether it became a backend, and if
// not, why. `kpr explain` prints it. It is recorded by the translation
// itself (hooks in parseSlices, parseSlice and endpointsFor), so it cannot
// disagree with what `kpr run` programs.
type Explanation struct {
	Service string `json:"service"`
	// Skipped is why kpr ignores the whole Service; empty when it does not.
	Skipped               string `json:"skipped,omitempty"`
	InternalTrafficPolicy string `json:"internalTrafficPolicy"`
	ExternalTrafficPolicy string `json:"externalTrafficPolicy,omitempty"`
	// TrafficDistribution is the Service's spec.trafficDistribution. It
	// acts only through the hints the EndpointSlice controller writes.
	TrafficDistribution string `json:"trafficDistribution,omitempty"`
	// AffinitySeconds is the ClientIP session affinity timeout; 0 is none.
	AffinitySeconds int `json:"sessionAffinitySeconds"`
	// Slices are the Service's EndpointSlices left out as a whole.
	Slices []SliceNote `json:"ignoredSlices,omitempty"`
	// Rejected are endpoints left out before any port was matched.
	Rejected []EndpointNote    `json:"rejectedEndpoints,omitempty"`
	Ports    []PortExplanation `json:"ports"`

	dups   []duplicateNote // per port, attached by merged
	byPort map[portKey]int // index in Ports
	// sliceOf names the slice each candidate came from, per port.
	sliceOf map[portKey]map[dataplane.Backend]string
}

// SliceNote is an EndpointSlice left out entirely.
type SliceNote struct {
	Slice     string   `json:"slice"`
	Reason    string   `json:"reason"`
	Addresses []string `json:"addresses,omitempty"`
}

// EndpointNote is an endpoint left out for a reason of its own.
type EndpointNote struct {
	Slice   string `json:"slice"`
	Address string `json:"address"`
	Reason  string `json:"reason"`
}

// PortExplanation covers one Service port: the decisions per family and
// the frontends the translation made.
type PortExplanation struct {
	Port      string              `json:"port"`
	Protocol  string              `json:"protocol"`
	Families  []FamilyExplanation `json:"families"`
	Frontends []FrontendBackends  `json:"frontends"`
}

// FamilyExplanation is one IP family of a port: the topology filter that
// applied, every candidate endpoint with its decision, and the two backend
// sets (cluster: the Cluster policies; local: the Local policies).
type FamilyExplanation struct {
	Family    string             `json:"family"`
	Topology  string             `json:"topology"`
	Endpoints []EndpointDecision `json:"endpoints"`
	Cluster   []string           `json:"clusterBackends"`
	Local     []string           `json:"localBackends"`
}

// EndpointDecision is one endpoint at one port. Cluster and Local say
// whether it is in that backend set: "used", "used: <why>", or the reason
// it is left out.
type EndpointDecision struct {
	Slice       string `json:"slice"`
	Backend     string `json:"backend"`
	Node        string `json:"node,omitempty"`
	Ready       bool   `json:"ready"`
	Serving     bool   `json:"serving"`
	Terminating bool   `json:"terminating"`
	Cluster     string `json:"cluster"`
	Local       string `json:"local"`
}

// FrontendBackends is one frontend and scope with the backend set it got.
type FrontendBackends struct {
	Frontend string `json:"frontend"` // address:port/protocol
	Kind     string `json:"kind"`
	// Scope is "internal" (sockets on this node) or "external" (traffic
	// from outside the node, where a Local policy applies).
	Scope string `json:"scope"`
	// Set names the backend set: "cluster" or "local".
	Set      string   `json:"set"`
	Backends []string `json:"backends"`
}

// Used is the decision of an endpoint that is in a backend set.
const Used = "used"

// Explain translates svc exactly as Translate does and also returns the
// Explanation of every decision. It allocates for the explanation;
// Translate, which passes no explainer, does not.
func Explain(svc *v1.Service, slices []*discoveryv1.EndpointSlice, node Node) ([]dataplane.ServicePort, []Problem, *Explanation) {
	ex := &explainer{Explanation{byPort: map[portKey]int{}, sliceOf: map[portKey]map[dataplane.Backend]string{}}}
	if svc != nil {
		ex.Service = svc.Namespace + "/" + svc.Name
	}
	if skip, why := SkipService(svc); skip {
		ex.Skipped = why
		return nil, nil, &ex.Explanation
	}
	ex.policies(svc)
	ports, _, problems := translate(svc, slices, node, ex)
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	for i := range ports {
		ex.frontends(&ports[i], internalLocal)
	}
	return ports, problems, &ex.Explanation
}

// explainer records the decisions of one translation.
type explainer struct{ Explanation }

type portKey struct {
	name  string
	proto dataplane.Protocol
}

type duplicateNote struct {
	port                      portKey
	dropped, kept             portEndpoint
	droppedSlice, keptInSlice string
}

func (ex *explainer) policies(svc *v1.Service) {
	ex.InternalTrafficPolicy = string(v1.ServiceInternalTrafficPolicyCluster)
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		ex.InternalTrafficPolicy = string(*p)
	}
	if hasNodePorts(svc) {
		ex.ExternalTrafficPolicy = string(svc.Spec.ExternalTrafficPolicy)
	}
	if d := svc.Spec.TrafficDistribution; d != nil {
		ex.TrafficDistribution = *d
	}
}

// skippedSlice records a slice SkipSlice refused, if it is this Service's.
func (ex *explainer) skippedSlice(t *translation, s *discoveryv1.EndpointSlice, why string) {
	key, ok := SliceServiceName(s)
	if !ok || key.Namespace != t.svc.Namespace || key.Name != t.svc.Name {
		return
	}
	note := SliceNote{Slice: sliceObject(s), Reason: why}
	for _, e := range s.Endpoints {
		note.Addresses = append(note.Addresses, e.Addresses...)
	}
	ex.Slices = append(ex.Slices, note)
}

// rejectedEndpoint records an endpoint parseEndpoint refused; reason is
// the Problem it reported.
func (ex *explainer) rejectedEndpoint(slice string, e *discoveryv1.Endpoint, reason string) {
	addr := ""
	if len(e.Addresses) > 0 {
		addr = e.Addresses[0]
	}
	ex.Rejected = append(ex.Rejected, EndpointNote{Slice: slice, Address: addr, Reason: reason})
}

// candidate records that the first copy of backend came from slice.
func (ex *explainer) candidate(port string, proto dataplane.Protocol, backend dataplane.Backend, slice string) {
	key := portKey{port, proto}
	m := ex.sliceOf[key]
	if m == nil {
		m = map[dataplane.Backend]string{}
		ex.sliceOf[key] = m
	}
	m[backend] = slice
}

// duplicate records a second copy (cand, from candSlice) of the ip:port of
// cur; replace says the translation keeps cand instead of cur.
func (ex *explainer) duplicate(port string, proto dataplane.Protocol, cand, cur portEndpoint, candSlice string, replace bool) {
	key := portKey{port, proto}
	curSlice := ex.sliceOf[key][cur.backend()]
	d := duplicateNote{port: key, dropped: cand, droppedSlice: candSlice, kept: cur, keptInSlice: curSlice}
	if replace {
		d = duplicateNote{port: key, dropped: cur, droppedSlice: curSlice, kept: cand, keptInSlice: candSlice}
		ex.sliceOf[key][cur.backend()] = candSlice
	}
	ex.dups = append(ex.dups, d)
}

// merged records the candidates of one Service port, per family, and
// decides each one's reason by running the same categorize the
// translation runs.
func (ex *explainer) merged(t *translation, port string, proto dataplane.Protocol, byFamily map[family][]portEndpoint) {
	ex.AffinitySeconds = int(dataplane.AffinitySeconds(t.affinity))
	key := portKey{port, proto}
	if _, seen := ex.byPort[key]; seen {
		return // the duplicate port, which the translation drops
	}
	pe := PortExplanation{Port: port, Protocol: proto.String()}
	for _, fam := range []family{ipv4, ipv6} {
		eps := byFamily[fam]
		if _, has := t.families[fam]; !has {
			if len(eps) > 0 {
				fe := FamilyExplanation{Family: fam.String(), Topology: "none", Cluster: []string{}, Local: []string{}}
				for _, e := range eps {
					why := "wrong address family: the Service has no " + fam.String() + " cluster IP"
					fe.Endpoints = append(fe.Endpoints, decision(e, ex.sliceOf[key][e.backend()], why, why))
				}
				pe.Families = append(pe.Families, fe)
			}
			continue
		}
		pe.Families = append(pe.Families, explainFamily(fam, eps, t.node, ex.sliceOf[key]))
	}
	for _, d := range ex.dups {
		if d.port != key {
			continue
		}
		why := fmt.Sprintf("duplicate of %s in %s, which is used instead", d.kept.backend().String(), d.keptInSlice)
		for i := range pe.Families {
			if pe.Families[i].Family == familyOf(d.dropped.addr).String() {
				pe.Families[i].Endpoints = append(pe.Families[i].Endpoints, decision(d.dropped, d.droppedSlice, why, why))
			}
		}
	}
	ex.byPort[key] = len(ex.Ports)
	ex.Ports = append(ex.Ports, pe)
}

// explainFamily decides the reason of every candidate of one family. Which
// endpoint is in which set comes from categorize itself; only the words
// for why not are chosen here, from the endpoint's conditions and hints.
func explainFamily(fam family, eps []portEndpoint, node Node, sliceOf map[dataplane.Backend]string) FamilyExplanation {
	sets := categorize(eps, node)
	mode := topologyFromHints(eps, node)
	anyReady, localReady := false, false
	for _, e := range eps {
		anyReady = anyReady || e.ready
		localReady = localReady || (e.ready && node.hosts(e.endpoint))
	}
	fe := FamilyExplanation{Family: fam.String(), Topology: mode.String(node),
		Cluster: backendStrings(sets.cluster), Local: backendStrings(sets.local)}
	for _, e := range eps {
		var cluster, local string
		switch {
		case slices.Contains(sets.cluster, e.backend()) && !e.ready:
			cluster = Used + ": terminating fallback, no endpoint is ready"
		case slices.Contains(sets.cluster, e.backend()):
			cluster = Used
		default:
			cluster = notUsed(e, anyReady, mode, node)
		}
		switch {
		case !node.hosts(e.endpoint):
			local = fmt.Sprintf("not local: on node %s, not this node %s", orUnset(e.nodeName), orUnset(node.Name))
		case slices.Contains(sets.local, e.backend()) && !e.ready:
			local = Used + ": terminating fallback, no local endpoint is ready"
		case slices.Contains(sets.local, e.backend()):
			local = Used
		default:
			local = notUsed(e, localReady, noTopology, node)
		}
		fe.Endpoints = append(fe.Endpoints, decision(e, sliceOf[e.backend()], cluster, local))
	}
	return fe
}

// notUsed words why categorize left e out of a set: peersReady says
// whether the set is made of ready endpoints (else it is the terminating
// fallback).
func notUsed(e portEndpoint, peersReady bool, mode topologyMode, node Node) string {
	switch {
	case peersReady && e.ready && !mode.admits(e.endpoint, node):
		if mode == sameNode {
			return fmt.Sprintf("topology: hinted for node(s) %s, not this node %s", strings.Join(e.nodeHints, ","), node.Name)
		}
		return fmt.Sprintf("topology: hinted for zone(s) %s, not this node's zone %s", strings.Join(e.zoneHints, ","), node.Zone)
	case peersReady && e.serving && e.terminating:
		return "terminating, and ready endpoints exist"
	case peersReady:
		return "not ready"
	case e.terminating && !e.serving:
		return "terminating and not serving"
	}
	return "not ready (and not terminating, so no fallback)"
}

func (m topologyMode) String(node Node) string {
	switch m {
	case sameNode:
		return "node hints: only endpoints hinted for node " + node.Name
	case sameZone:
		return "zone hints: only endpoints hinted for zone " + node.Zone
	}
	return "none"
}

func decision(e portEndpoint, slice, cluster, local string) EndpointDecision {
	return EndpointDecision{
		Slice: slice, Backend: e.backend().String(), Node: e.nodeName,
		Ready: e.ready, Serving: e.serving, Terminating: e.terminating,
		Cluster: cluster, Local: local,
	}
}

// frontends records the frontends of a translated ServicePort with the
// set each scope got, the way ebpfplane expands them into map entries.
func (ex *explainer) frontends(sp *dataplane.ServicePort, internalLocal bool) {
	i, ok := ex.byPort[portKey{sp.Name.Port, sp.Name.Protocol}]
	if !ok {
		return
	}
	pe := &ex.Ports[i]
	for _, f := range sp.Frontends {
		id := f.ID().String()
		set := "cluster"
		if f.Kind == dataplane.ClusterIP && internalLocal {
			set = "local"
		}
		pe.Frontends = append(pe.Frontends, FrontendBackends{Frontend: id, Kind: f.Kind.String(), Scope: "internal", Set: set, Backends: backendStrings(f.Backends)})
		if f.ExternalBackends != nil {
			pe.Frontends = append(pe.Frontends, FrontendBackends{Frontend: id, Kind: f.Kind.String(), Scope: "external", Set: "local", Backends: backendStrings(f.ExternalBackends)})
		}
	}
}

func backendStrings(bs []dataplane.Backend) []string {
	out := make([]string, 0, len(bs))
	for _, b := range bs {
		out = append(out, netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	return out
}

func orUnset(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}
