package dataplane

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"
)

// Protocol is an IP protocol number, as carried in the BPF maps.
type Protocol uint8

const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// ServicePortName identifies one port of one Service, the unit kube-proxy
// programs and the unit kpr applies.
type ServicePortName struct {
	Namespace string
	Name      string
	// Port is the Service port's name; empty for a single unnamed port.
	Port     string
	Protocol Protocol
}

func (n ServicePortName) String() string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s + "/" + n.Protocol.String()
}

// Compare orders ServicePortNames by namespace, then Service name, then
// port name, then protocol number: the name order in which every part of
// kpr sorts them, so that conflicts are resolved, room is given and rules
// are written the same way everywhere. It compares the fields in place:
// sorting by String() built two strings per comparison, which was a
// quarter of a full reconcile of 10,000 Services.
func (n ServicePortName) Compare(o ServicePortName) int {
	if c := strings.Compare(n.Namespace, o.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(n.Name, o.Name); c != 0 {
		return c
	}
	if c := strings.Compare(n.Port, o.Port); c != 0 {
		return c
	}
	return cmp.Compare(n.Protocol, o.Protocol)
}

// FrontendKind says how a frontend address came to exist. Backends use it for
// display and to decide which traffic policy governs the frontend.
type FrontendKind uint8

const (
	ClusterIP FrontendKind = iota
	NodePort
	ExternalIP
	LoadBalancer
)

func (k FrontendKind) String() string {
	switch k {
	case ClusterIP:
		return "ClusterIP"
	case NodePort:
		return "NodePort"
	case ExternalIP:
		return "ExternalIP"
	case LoadBalancer:
		return "LoadBalancer"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Backend is one endpoint address and port that traffic may be sent to.
type Backend struct {
	Addr netip.Addr
	Port uint16
}

func (b Backend) String() string { return netip.AddrPortFrom(b.Addr, b.Port).String() }

// Compare orders Backends by address (IPv4 before IPv6, as netip.Addr
// orders them), then port: the order of every sorted backend set.
func (b Backend) Compare(o Backend) int {
	if c := b.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	return cmp.Compare(b.Port, o.Port)
}

// Frontend is one address:port a client may connect to, together with the
// backend sets that serve it.
type Frontend struct {
	Addr     netip.Addr
	Port     uint16
	Protocol Protocol
	Kind     FrontendKind

	// Backends serve traffic that starts inside the cluster: every socket on
	// this node. For a ClusterIP this is the set after internalTrafficPolicy;
	// for NodePort, ExternalIP and LoadBalancer frontends it is the
	// cluster-wide set, because kube-proxy sends locally originated traffic to
	// cluster endpoints even under externalTrafficPolicy: Local.
	// An empty set means "reject new connections".
	Backends []Backend

	// ExternalBackends, when non-nil, serve traffic that arrives from outside
	// the node (externalTrafficPolicy: Local keeps it on node-local endpoints).
	// Nil means external traffic uses Backends.
	ExternalBackends []Backend
}

// AddrPort returns the frontend's address and port.
func (f Frontend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(f.Addr, f.Port) }

// ServicePort is the complete desired state of one Service port.
type ServicePort struct {
	Name      ServicePortName
	Frontends []Frontend
	// AffinityTimeout is the ClientIP session affinity timeout; zero means no
	// session affinity. Backends program it in whole seconds, as
	// AffinitySeconds rounds it.
	AffinityTimeout time.Duration
	// SourceRanges are the Service's loadBalancerSourceRanges, parsed:
	// masked, IPv4 as 4-byte prefixes, sorted, without duplicates. They
	// restrict LoadBalancer frontends only, and each frontend only by the
	// prefixes of its own family (SourceRangesFor): with none of its
	// family it accepts every client, as kube-proxy's per-family proxiers
	// do. A restricted frontend accepts new connections only from sources
	// inside one of its prefixes and drops the others.
	SourceRanges []netip.Prefix
	// HealthCheckNodePort is the Service's healthCheckNodePort when it has
	// externalTrafficPolicy Local, else 0. kpr's health server answers on
	// it on every node address; a backend that makes Service addresses
	// the node's own (IPVS binds them to a device and filters the ports
	// they answer on) must let it through there as well, because a cloud
	// load balancer may probe it at the load-balancer IP.
	HealthCheckNodePort uint16
}

// SourceRangesFor returns the prefixes that restrict fe, nil when fe
// accepts every client: fe is not a LoadBalancer frontend, or sp has no
// source range of fe's family.
func (sp *ServicePort) SourceRangesFor(fe Frontend) []netip.Prefix {
	if fe.Kind != LoadBalancer || len(sp.SourceRanges) == 0 {
		return nil
	}
	is4 := fe.Addr.Unmap().Is4()
	var out []netip.Prefix
	for _, p := range sp.SourceRanges {
		if p.Addr().Is4() == is4 {
			out = append(out, p)
		}
	}
	return out
}

// Dataplane is what the control plane drives. What it may rely on:
//
//   - No two ServicePorts it is handed share a frontend (Frontend.ID): the
//     control plane resolves conflicts first (Claims), so a backend never
//     has to decide which Service a frontend belongs to.
//   - A ServicePort handed over is never modified afterwards; a changed one
//     comes as a new value. A backend may keep the pointer and compare it.
//   - Calls come from one goroutine.
//
// What it must do: make each call atomic per ServicePort (on error a
// ServicePort is left as it was before the call, never half-written), and
// after a successful write remove the state that still sends UDP traffic
// to backends that left (RemovedUDPBackends). dataplanetest checks all of
// it.
type Dataplane interface {
	// Apply programs the given ServicePorts. A nil value deletes the
	// ServicePort and every frontend it had.
	Apply(changes map[ServicePortName]*ServicePort) error
	// Reconcile makes the dataplane hold exactly the given ServicePorts,
	// repairing drift and removing anything not listed.
	Reconcile(all map[ServicePortName]*ServicePort) error
}

// Refusal is a ServicePort the dataplane accepted but cannot program for
// now, while it goes on serving every other ServicePort: one bad or
// oversized Service must not fail every sync and so make the node look
// unhealthy. The dataplane keeps retrying it on its own.
type Refusal struct {
	// Reason is one CamelCase word, as Kubernetes Events have it, such as
	// RefusedMapFull.
	Reason string
	// Message says what is wrong and what fixes it.
	Message string
}

// RefusedMapFull is the Reason of a ServicePort that does not fit in the
// dataplane's tables.
const RefusedMapFull = "MapFull"

// Refuser is implemented by dataplanes that refuse single ServicePorts
// instead of failing a whole Apply or Reconcile. A refused ServicePort still
// counts as handed over: the dataplane programs it, without being asked
// again, once it fits.
type Refuser interface {
	// Refused returns the ServicePorts refused as of the last Apply or
	// Reconcile. It is safe to call from any goroutine.
	Refused() map[ServicePortName]Refusal
}

// DriftChecker is implemented by a dataplane that can check for drift in
// small steps. The periodic full reconcile then does not hold up other
// changes: the sync loop runs the steps between its Apply calls, and calls
// Reconcile only when a check finds something to repair.
type DriftChecker interface {
	// StartDriftCheck begins a check of whether the dataplane holds
	// exactly what the Apply and Reconcile calls so far handed it. Apply
	// may be called between its steps; a check started earlier is
	// abandoned.
	StartDriftCheck() DriftCheck
}

// DriftCheck is one check begun by StartDriftCheck.
type DriftCheck interface {
	// Step checks a bounded part of the dataplane, quickly enough to run
	// between two Apply calls. Once done, held is true if the dataplane
	// holds exactly what it was handed; false means a Reconcile with the
	// complete state is needed (drift, an earlier failed call, or a
	// conflict only a Reconcile resolves).
	Step() (done, held bool, err error)
}

// AffinitySeconds is a ClientIP affinity timeout in the whole seconds every
// backend programs (the BPF maps, iptables' recent match and IPVS
// persistence all count seconds): rounded up, so that a client sticks at
// least as long as asked and a timeout under a second still turns affinity
// on; 0, off, for a timeout that is not positive. A timeout beyond what 32
// bits of seconds hold (136 years) is held at the most they do.
func AffinitySeconds(timeout time.Duration) uint32 {
	if timeout <= 0 {
		return 0
	}
	secs := timeout / time.Second
	if timeout%time.Second != 0 {
		secs++
	}
	return uint32(min(secs, math.MaxUint32))
}
