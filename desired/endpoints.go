package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
)

// parsedSlice is the part of an EndpointSlice the translation uses, already
// validated: every port and endpoint in it is usable.
type parsedSlice struct {
	name      string // namespace/name, for Explain
	family    family
	ports     []slicePort
	endpoints []endpoint
}

// slicePort is one named port of a slice. The slice carries the resolved
// port number, which is how a Service's named targetPort reaches kpr.
type slicePort struct {
	name  string
	proto dataplane.Protocol
	port  uint16
}

// endpoint is one endpoint of a slice, with its conditions defaulted the
// way the API documents (missing ready/serving = true, terminating = false).
type endpoint struct {
	addr        netip.Addr
	nodeName    string
	ready       bool
	serving     bool
	terminating bool
	zoneHints   []string
	nodeHints   []string
}

// portEndpoint is an endpoint at one port: a candidate backend.
type portEndpoint struct {
	endpoint
	port uint16
}

func (e portEndpoint) backend() dataplane.Backend {
	return dataplane.Backend{Addr: e.addr, Port: e.port}
}

// parseSlices validates the slices that belong to the Service and orders
// them by name, so that merging them does not depend on the caller's order.
func (t *translation) parseSlices(in []*discoveryv1.EndpointSlice) []parsedSlice {
	var mine []*discoveryv1.EndpointSlice
	for _, s := range in {
		if skip, why := SkipSlice(s); skip {
			if t.explain != nil {
				t.explain.skippedSlice(t, s, why)
			}
			continue
		}
		key, _ := SliceServiceName(s)
		if key.Namespace != t.svc.Namespace || key.Name != t.svc.Name {
			t.problem(sliceObject(s), "belongs to Service "+key.String()+", not "+t.svcObject+"; ignored")
			continue
		}
		mine = append(mine, s)
	}
	slices.SortStableFunc(mine, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })

	out := make([]parsedSlice, 0, len(mine))
	for _, s := range mine {
		out = append(out, t.parseSlice(s))
	}
	return out
}

func sliceObject(s *discoveryv1.EndpointSlice) string { return s.Namespace + "/" + s.Name }

func (t *translation) parseSlice(s *discoveryv1.EndpointSlice) parsedSlice {
	obj := sliceObject(s)
	ps := parsedSlice{name: obj, family: ipv4}
	if s.AddressType == discoveryv1.AddressTypeIPv6 {
		ps.family = ipv6
	}

	for _, p := range s.Ports {
		if p.Name == nil {
			// Upstream ignores these too: a port must be named (possibly
			// with the empty name) to be joined to a Service port.
			t.problem(obj, "port with no name ignored")
			continue
		}
		if p.Port == nil {
			t.problem(obj, "port "+quote(*p.Name)+" has no port number; ignored")
			continue
		}
		num, ok := portNumber(*p.Port)
		if !ok {
			t.problem(obj, fmt.Sprintf("port %s number %d is out of range 1-65535; ignored", quote(*p.Name), *p.Port))
			continue
		}
		proto := dataplane.TCP // the API default
		if p.Protocol != nil {
			var err error
			if proto, err = parseProtocol(string(*p.Protocol)); err != nil {
				t.problem(obj, "port "+quote(*p.Name)+": "+err.Error())
				continue
			}
		}
		ps.ports = append(ps.ports, slicePort{name: *p.Name, proto: proto, port: num})
	}

	ps.endpoints = make([]endpoint, 0, len(s.Endpoints))
	for i := range s.Endpoints {
		if ep, ok := t.parseEndpoint(obj, ps.family, &s.Endpoints[i]); ok {
			ps.endpoints = append(ps.endpoints, ep)
		} else if t.explain != nil {
			t.explain.rejectedEndpoint(obj, &s.Endpoints[i], t.problems[len(t.problems)-1].Reason)
		}
	}
	return ps
}

// parseEndpoint validates one endpoint. Like kube-proxy it uses the first
// address only: the API defines the others as interchangeable.
func (t *translation) parseEndpoint(obj string, fam family, e *discoveryv1.Endpoint) (endpoint, bool) {
	if len(e.Addresses) == 0 {
		t.problem(obj, "endpoint with no address ignored")
		return endpoint{}, false
	}
	a, ok := parseIP(e.Addresses[0])
	if !ok {
		t.problem(obj, "endpoint address "+quote(e.Addresses[0])+" is not a usable IP address; ignored")
		return endpoint{}, false
	}
	if familyOf(a) != fam {
		t.problem(obj, fmt.Sprintf("endpoint address %s is not %s like the slice's addressType; ignored", a, fam))
		return endpoint{}, false
	}

	c := e.Conditions
	ep := endpoint{
		addr:        a,
		ready:       c.Ready == nil || *c.Ready,
		serving:     c.Serving == nil || *c.Serving,
		terminating: c.Terminating != nil && *c.Terminating,
	}
	// publishNotReadyAddresses asks for every endpoint to be used as if it
	// were ready, whatever its probes say.
	if t.svc.Spec.PublishNotReadyAddresses {
		ep.ready, ep.serving = true, true
	}
	if e.NodeName != nil {
		ep.nodeName = *e.NodeName
	}
	if h := e.Hints; h != nil {
		for _, z := range h.ForZones {
			ep.zoneHints = append(ep.zoneHints, z.Name)
		}
		for _, n := range h.ForNodes {
			ep.nodeHints = append(ep.nodeHints, n.Name)
		}
	}
	return ep, true
}

// endpointsFor merges the endpoints of all slices for the Service port with
// the given name and protocol, per family, without duplicate ip:port pairs.
//
// When one ip:port appears more than once (an endpoint moving between
// slices), kube-proxy prefers the copy on this node; kpr also prefers a
// ready copy over a not-ready one, and otherwise keeps the first in slice
// name order, so the result never depends on the caller's ordering.
// maxScannedEndpoints is how many candidate endpoints endpointsFor
// deduplicates by a scan rather than a map.
const maxScannedEndpoints = 32

func (t *translation) endpointsFor(portName string, proto dataplane.Protocol) map[family][]portEndpoint {
	// Sized once: a full sync translates every Service, and growing the
	// index and lists entry by entry was most of its garbage.
	n := 0
	for i := range t.slices {
		for _, p := range t.slices[i].ports {
			if p.name == portName && p.proto == proto {
				n += len(t.slices[i].endpoints)
			}
		}
	}
	out := make(map[family][]portEndpoint, 2)
	// index finds duplicates (its value is the position in out[family
	// of the key]); up to a few dozen endpoints a scan of out is cheaper
	// than a map.
	var index map[dataplane.Backend]int
	if n > maxScannedEndpoints {
		index = make(map[dataplane.Backend]int, n)
	}
	find := func(fam family, key dataplane.Backend) (int, bool) {
		if index != nil {
			at, ok := index[key]
			return at, ok
		}
		for at := range out[fam] {
			if out[fam][at].backend() == key {
				return at, true
			}
		}
		return 0, false
	}
	for i := range t.slices {
		s := &t.slices[i]
		for _, p := range s.ports {
			if p.name != portName || p.proto != proto {
				continue
			}
			for _, ep := range s.endpoints {
				pe := portEndpoint{endpoint: ep, port: p.port}
				key := pe.backend()
				if at, dup := find(s.family, key); dup {
					prev := &out[s.family][at]
					replace := t.preferred(pe, *prev)
					if t.explain != nil {
						t.explain.duplicate(portName, proto, pe, *prev, s.name, replace)
					}
					if replace {
						*prev = pe
					}
					continue
				}
				if t.explain != nil {
					t.explain.candidate(portName, proto, key, s.name)
				}
				if index != nil {
					index[key] = len(out[s.family])
				}
				if out[s.family] == nil {
					out[s.family] = make([]portEndpoint, 0, n)
				}
				out[s.family] = append(out[s.family], pe)
			}
		}
	}
	if t.explain != nil {
		t.explain.merged(t, portName, proto, out)
	}
	return out
}

// preferred reports whether candidate should replace current, a duplicate
// of the same ip:port.
func (t *translation) preferred(candidate, current portEndpoint) bool {
	cl, pl := t.node.hosts(candidate.endpoint), t.node.hosts(current.endpoint)
	if cl != pl {
		return cl
	}
	return candidate.ready && !current.ready
}

// hosts reports whether the endpoint runs on this node.
func (n Node) hosts(ep endpoint) bool {
	return n.Name != "" && ep.nodeName == n.Name
}
