package watcher

import (
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/desired"
)

// nodeTracker keeps what the translation needs to know about this node,
// fed by the single-Node informer.
type nodeTracker struct {
	name     string
	prefixes []netip.Prefix
	health   HealthReporter

	mu   sync.Mutex
	info desired.Node
	seen bool
}

func newNodeTracker(name string, prefixes []netip.Prefix, health HealthReporter) *nodeTracker {
	return &nodeTracker{name: name, prefixes: prefixes, health: health, info: desired.Node{Name: name}}
}

// current returns the node facts for translation. Before the Node object
// has been seen it has only the name: NodePorts are then served on loopback
// only, until the Node appears and every Service is recomputed.
func (n *nodeTracker) current() desired.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.info
}

// known reports whether the Node object has been seen.
func (n *nodeTracker) known() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seen
}

// update takes the latest Node object and reports whether the facts that
// feed the translation changed. Status heartbeats change nothing, so they do
// not cost a recomputation of every Service.
func (n *nodeTracker) update(node *v1.Node) (changed bool) {
	if n.health != nil {
		n.health.SetNode(node)
	}
	info := nodeInfo(node, n.prefixes)
	n.mu.Lock()
	defer n.mu.Unlock()
	changed = !n.seen || !equalNode(n.info, info)
	n.info, n.seen = info, true
	return changed
}

// deleted records that the Node object is gone. The last known facts are
// kept for translation: a node being removed should keep serving until kpr
// is stopped, not drop its NodePorts.
func (n *nodeTracker) deleted() {
	if n.health != nil {
		n.health.SetNode(nil)
	}
}

// nodeInfo extracts the zone label and the node's InternalIP and ExternalIP
// addresses that fall inside one of prefixes (all of them if prefixes is
// empty), sorted and without duplicates.
func nodeInfo(node *v1.Node, prefixes []netip.Prefix) desired.Node {
	info := desired.Node{Name: node.Name, Zone: node.Labels[v1.LabelTopologyZone]}
	for _, a := range node.Status.Addresses {
		if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
			continue
		}
		addr, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue // the API server validates addresses; nothing usable here
		}
		addr = addr.Unmap()
		if inPrefixes(addr, prefixes) {
			info.Addresses = append(info.Addresses, addr)
		}
	}
	slices.SortFunc(info.Addresses, netip.Addr.Compare)
	info.Addresses = slices.Compact(info.Addresses)
	return info
}

func inPrefixes(addr netip.Addr, prefixes []netip.Prefix) bool {
	if len(prefixes) == 0 {
		return true
	}
	return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(addr) })
}

func equalNode(a, b desired.Node) bool {
	return a.Name == b.Name && a.Zone == b.Zone && slices.Equal(a.Addresses, b.Addresses)
}
