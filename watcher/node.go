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
	name   string
	config desired.NodeConfig
	health HealthReporter
	// onNodeIPs is Config.NodeIPs.
	onNodeIPs func([]netip.Addr)

	mu   sync.Mutex
	info desired.Node
	seen bool
	// object is the latest Node object, local the addresses on the
	// node's own devices (SetLocalAddresses): info is made of both.
	object *v1.Node
	local  []netip.Addr
	// nodeIPs are the Node object's addresses onNodeIPs was last given.
	nodeIPs []netip.Addr
}

func newNodeTracker(name string, config desired.NodeConfig, health HealthReporter) *nodeTracker {
	return &nodeTracker{name: name, config: config, health: health, info: desired.NewNode(name, nil, config)}
}

// current returns the node facts for translation. Before the Node object
// has been seen it has only the name and the local addresses: NodePorts
// are then served at most on those and loopback, until the Node appears
// and every Service is recomputed.
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
	n.mu.Lock()
	info := desired.NewNode(n.name, node, n.config, n.local...)
	changed = !n.seen || !n.info.Equal(info)
	n.info, n.seen, n.object = info, true, node
	ips := desired.NodeIPs(node)
	ipsChanged := n.onNodeIPs != nil && (n.nodeIPs == nil || !slices.Equal(n.nodeIPs, ips))
	if ipsChanged {
		n.nodeIPs = append([]netip.Addr{}, ips...) // non-nil once given
	}
	n.mu.Unlock()
	if ipsChanged {
		n.onNodeIPs(ips)
	}
	return changed
}

// setLocal takes the addresses on the node's own devices and reports
// whether the facts changed.
func (n *nodeTracker) setLocal(addrs []netip.Addr) (changed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.local = slices.Clone(addrs)
	info := desired.NewNode(n.name, n.object, n.config, n.local...)
	changed = !n.info.Equal(info)
	n.info = info
	return changed
}

// SetLocalAddresses gives the addresses on the node's own devices, which
// serve NodePorts besides the Node object's InternalIPs and ExternalIPs,
// filtered by NodePortAddresses alike (kube-proxy serves NodePorts on the
// node's interface addresses). When they change, every Service is
// recomputed. Safe to call from any goroutine, before or during Run.
func (w *Watcher) SetLocalAddresses(addrs []netip.Addr) {
	if w.node.setLocal(addrs) {
		w.runner.tracker.allChanged()
	}
}

// deleted records that the Node object is gone. The last known facts are
// kept for translation: a node being removed should keep serving until kpr
// is stopped, not drop its NodePorts.
func (n *nodeTracker) deleted() {
	if n.health != nil {
		n.health.SetNode(nil)
	}
}

func equalNode(a, b desired.Node) bool { return a.Equal(b) }
