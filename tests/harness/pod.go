package harness

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// Pod is a network namespace playing a pod: eth0 (a veth whose other end,
// HostVeth, is a port of the node bridge) with one IPv4 and one IPv6
// address, default routes via the node gateways, and lo up.
type Pod struct {
	Name  string
	NetNS *NetNS
	IPv4  netip.Addr
	IPv6  netip.Addr
	// HostVeth is the node-side end of the pod's veth pair, HostVethIndex
	// its ifindex inside the node namespace (e.g. for tc programs).
	HostVeth      string
	HostVethIndex int
	// EthIndex is the ifindex of eth0 inside the pod namespace.
	EthIndex int

	node *Node
	// routed: on no bridge (Node.AddRoutedPod).
	routed bool

	mu      sync.Mutex
	servers []*Server
	gone    bool
}

// Addrs returns the pod's IPv4 and IPv6 addresses, in that order.
func (p *Pod) Addrs() []netip.Addr { return []netip.Addr{p.IPv4, p.IPv6} }

// ServeTCP starts a TCP echo server on port (IPv4 and IPv6) inside the pod.
// Each connection first receives "<pod name>\n", then gets back every byte
// it sends until it closes. Hits counts accepted connections.
func (p *Pod) ServeTCP(port uint16) (*Server, error) {
	return p.startServer(TCP, port)
}

// ServeUDP starts a UDP echo server on port (IPv4 and IPv6) inside the pod.
// Each datagram is answered with "<pod name>\n<payload>". Hits counts
// datagrams received.
func (p *Pod) ServeUDP(port uint16) (*Server, error) {
	return p.startServer(UDP, port)
}

// ServeHTTP starts an HTTP server on port (IPv4 and IPv6) inside the pod.
// GET / answers "hello from <pod name>\n", GET /source the client's
// address as the pod sees it; other paths answer 404. Hits counts
// requests.
func (p *Pod) ServeHTTP(port uint16) (*Server, error) {
	return p.startServer(HTTP, port)
}

func (p *Pod) startServer(proto Protocol, port uint16) (*Server, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return nil, fmt.Errorf("pod %s was removed", p.Name)
	}
	s, err := startServer(p.NetNS, p.Name, proto, port)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", p.Name, err)
	}
	p.servers = append(p.servers, s)
	return s, nil
}

// Servers returns the pod's running servers.
func (p *Pod) Servers() []*Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.servers)
}

// StopServers stops every server of the pod and waits for them to exit.
func (p *Pod) StopServers() error {
	p.mu.Lock()
	servers := p.servers
	p.servers = nil
	p.mu.Unlock()
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Stop())
	}
	return errors.Join(errs...)
}

// teardown stops the servers, deletes the veth pair (from the node side,
// which removes both ends) and the namespace. Idempotent.
func (p *Pod) teardown() error {
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return nil
	}
	p.gone = true
	p.mu.Unlock()

	errs := []error{p.StopServers()}
	if p.HostVethIndex != 0 {
		nl := p.node.NetNS.Netlink()
		if l, err := nl.LinkByIndex(p.HostVethIndex); err == nil {
			if err := nl.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete veth %s of pod %s: %w", p.HostVeth, p.Name, err))
			}
		}
	}
	if p.NetNS != nil {
		errs = append(errs, p.NetNS.destroy())
	}
	return errors.Join(errs...)
}
