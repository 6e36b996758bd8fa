package desired

import (
	"slices"

	"github.com/kpr-io/kpr/dataplane"
)

// endpointSets are the backend sets of one Service port and family, as
// upstream's CategorizeEndpoints computes them. Both are sorted and never
// nil: an empty set means "reject" (or, as ExternalBackends, "drop").
type endpointSets struct {
	// cluster serves the Cluster traffic policy: ready endpoints after the
	// topology filter, or every serving+terminating endpoint when no
	// endpoint is ready anywhere.
	cluster []dataplane.Backend
	// local serves the Local traffic policies: this node's ready endpoints,
	// else its serving+terminating ones, else none.
	local []dataplane.Backend
	// localTerminating: local is that serving+terminating fallback, which
	// keeps connections served but does not make the node healthy for a
	// load balancer (the health check counts ready endpoints only).
	localTerminating bool
}

// topologyMode is the topology filter the endpoints' hints ask for.
type topologyMode uint8

const (
	noTopology topologyMode = iota
	sameNode
	sameZone
)

func categorize(eps []portEndpoint, node Node) endpointSets {
	mode := topologyFromHints(eps, node)
	sets := endpointSets{
		cluster: backendsWhere(eps, func(e portEndpoint) bool {
			return e.ready && mode.admits(e.endpoint, node)
		}),
	}
	// The topology filter never empties the set while a ready endpoint
	// exists (the mode is only chosen when one matches this node), so an
	// empty set here means nothing is ready anywhere.
	if len(sets.cluster) == 0 {
		sets.cluster = backendsWhere(eps, func(e portEndpoint) bool { return e.serving && e.terminating })
	}

	sets.local = backendsWhere(eps, func(e portEndpoint) bool { return e.ready && node.hosts(e.endpoint) })
	if len(sets.local) == 0 {
		sets.local = backendsWhere(eps, func(e portEndpoint) bool {
			return e.serving && e.terminating && node.hosts(e.endpoint)
		})
		sets.localTerminating = len(sets.local) > 0
	}
	return sets
}

// topologyFromHints decides the topology filter from the hints the
// EndpointSlice controller wrote, as upstream does: the Service's
// trafficDistribution and topology-mode annotation act only through those
// hints. Node hints win when every ready endpoint has one and at least one
// names this node; otherwise zone hints apply when every ready endpoint has
// one and at least one names this node's zone. Anything less (a missing
// hint, a node without a zone label, no hint for us) means no filter, so
// traffic is never black-holed by incomplete hints.
func topologyFromHints(eps []portEndpoint, node Node) topologyMode {
	anyReady := false
	allNodeHints, forThisNode := true, false
	allZoneHints, forThisZone := true, false
	for _, e := range eps {
		if !e.ready {
			continue
		}
		anyReady = true
		if len(e.nodeHints) == 0 {
			allNodeHints = false
		} else if node.Name != "" && slices.Contains(e.nodeHints, node.Name) {
			forThisNode = true
		}
		if len(e.zoneHints) == 0 {
			allZoneHints = false
		} else if node.Zone != "" && slices.Contains(e.zoneHints, node.Zone) {
			forThisZone = true
		}
	}
	switch {
	case !anyReady:
		return noTopology
	case allNodeHints && forThisNode:
		return sameNode
	case allZoneHints && forThisZone:
		return sameZone
	}
	return noTopology
}

// admits reports whether the topology filter lets this node use ep.
func (m topologyMode) admits(ep endpoint, node Node) bool {
	switch m {
	case sameNode:
		return slices.Contains(ep.nodeHints, node.Name)
	case sameZone:
		return slices.Contains(ep.zoneHints, node.Zone)
	}
	return true
}

// backendsWhere returns the sorted backends of the endpoints that keep
// says to keep; never nil.
func backendsWhere(eps []portEndpoint, keep func(portEndpoint) bool) []dataplane.Backend {
	out := []dataplane.Backend{}
	for _, e := range eps {
		if keep(e) {
			out = append(out, e.backend())
		}
	}
	slices.SortFunc(out, dataplane.Backend.Compare)
	return out
}
