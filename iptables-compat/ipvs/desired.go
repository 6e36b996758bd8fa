package ipvs

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"

	"github.com/kpr-io/kpr/dataplane"
)

// The ipsets, by role, as kube-proxy's IPVS mode has them (its KUBE-*
// sets), with kpr's prefix. The iptables rules (rules.go) match them, so
// the rules stay the same however many Services there are. Each exists per
// family: IPv6 sets carry "6-" after the prefix, as kube-proxy's do.
const (
	// setClusterIP holds the ClusterIP frontends: traffic of the node
	// itself to them is masqueraded, or it would leave with the VIP as
	// its source.
	setClusterIP = "CLUSTER-IP"
	// setExternal holds NodePort, external and load-balancer frontends
	// under externalTrafficPolicy Cluster: every connection is
	// masqueraded, since its endpoint may be on another node.
	setExternal = "EXTERNAL"
	// setExternalLocal holds those under externalTrafficPolicy Local:
	// traffic from outside keeps its source address.
	setExternalLocal = "EXTERNAL-LOCAL"
	// setFirewall holds load-balancer frontends with
	// loadBalancerSourceRanges (kube-proxy's KUBE-LOAD-BALANCER-FW).
	setFirewall = "LOAD-BALANCER-FW"
	// setSourceCIDR holds their frontend and allowed source prefix pairs
	// (KUBE-LOAD-BALANCER-SOURCE-CIDR).
	setSourceCIDR = "LOAD-BALANCER-SOURCE-CIDR"
	// setLoopBack holds endpoint, port and endpoint triples
	// (KUBE-LOOP-BACK): an endpoint that reaches itself through a Service
	// is masqueraded, or it would answer itself directly.
	setLoopBack = "LOOP-BACK"
	// setBound holds every address bound to the dummy interface
	// (KUBE-IPVS-IPS), for KPR-IPVS-FILTER.
	setBound = "IPVS-IPS"
	// setHealthCheck holds the bound addresses of externalTrafficPolicy
	// Local Services with their healthCheckNodePort, which
	// KPR-IPVS-FILTER lets through (kube-proxy's
	// KUBE-HEALTH-CHECK-NODE-PORT): a cloud load balancer may probe it at
	// the load-balancer IP, which is bound here and so filtered.
	setHealthCheck = "HEALTH-CHECK-NODE-PORT"
)

var setRoles = []string{setClusterIP, setExternal, setExternalLocal, setFirewall, setSourceCIDR, setLoopBack, setBound, setHealthCheck}

// setName is the kernel name of a role's set in one family.
func setName(role string, ipv6 bool) string {
	if ipv6 {
		return "KPR-6-" + role
	}
	return "KPR-" + role
}

// setSpecs are every set the Plane keeps.
func setSpecs() []SetSpec {
	var out []SetSpec
	for _, v6 := range []bool{false, true} {
		for _, role := range setRoles {
			typ := "hash:ip,port"
			switch role {
			case setSourceCIDR:
				typ = "hash:ip,port,net"
			case setLoopBack:
				typ = "hash:ip,port,ip"
			case setBound:
				typ = "hash:ip"
			}
			out = append(out, SetSpec{Name: setName(role, v6), Type: typ, IPv6: v6})
		}
	}
	return out
}

// setEntry is one member of one set.
type setEntry struct {
	set   string
	entry Entry
}

// The firewall marks of the virtual servers that serve traffic of the node
// itself to a frontend whose outside traffic gets other backends
// (externalTrafficPolicy Local): IPVS has one virtual server per address
// and port, so the node's own connections are marked in nat OUTPUT and
// meet a fwmark virtual server, which IPVS looks up first. Each mark
// carries the masquerade bit, so the nat rules that set it for the same
// traffic leave the mark as it is; the low 14 bits number the frontends.
const (
	masqMark   uint32 = 0x4000
	markIDMask uint32 = 0x3fff
)

// ownMark reports whether m is one of the Plane's firewall marks.
func ownMark(m uint32) bool { return m&^markIDMask == masqMark && m&markIDMask != 0 }

// wantService is a virtual server as the desired state has it.
type wantService struct {
	Service
	backends []dataplane.Backend // sorted, of the service's family
}

// contribution is what one ServicePort asks of the kernel.
type contribution struct {
	services map[ServiceKey]*wantService
	// bind are the addresses the dummy interface must carry: every
	// frontend's but the NodePorts', which are the node's own.
	bind    []netip.Addr
	entries []setEntry
	// internal maps a frontend's virtual server to the firewall mark of
	// the virtual server that serves the node's own traffic to it.
	internal map[ServiceKey]uint32
}

// markAllocator hands out the firewall mark of a frontend; it is asked only
// for frontends that need one.
type markAllocator func(fe ServiceKey) uint32

// desire is what sp asks of the kernel, with scheduler for its virtual
// servers. It is pure but for the marks, which alloc decides.
// Frontends of a family the Plane does not program (ipv6 false) are left
// out.
func desire(sp *dataplane.ServicePort, scheduler string, ipv6 bool, alloc markAllocator) (*contribution, error) {
	c := &contribution{services: map[ServiceKey]*wantService{}, internal: map[ServiceKey]uint32{}}
	timeout := dataplane.AffinitySeconds(sp.AffinityTimeout)
	for _, fe := range sp.Frontends {
		key := addrKey(fe.Addr, fe.Protocol, fe.Port)
		if !servable(fe) || (key.IPv6 && !ipv6) {
			continue
		}
		internal := familyBackends(fe.Backends, key.IPv6)
		external := internal
		if fe.ExternalBackends != nil {
			external = familyBackends(fe.ExternalBackends, key.IPv6)
		}
		svc := func(k ServiceKey, bs []dataplane.Backend) *wantService {
			return &wantService{Service: Service{Key: k, Scheduler: scheduler, Timeout: timeout}, backends: bs}
		}
		// The address's virtual server serves traffic from outside, as in
		// kube-proxy; when the node's own traffic is to get other
		// backends, a fwmark virtual server serves it.
		c.services[key] = svc(key, external)
		if !slices.Equal(internal, external) {
			mark := alloc(key)
			if mark == 0 {
				return nil, fmt.Errorf("%w: frontend %s needs a firewall mark for the node's own traffic (externalTrafficPolicy Local "+
					"with other endpoints than the cluster's), and all are taken; fewer such frontends make it fit, or run kpr in --mode ebpf, "+
					"which has no such limit", errNoMark, key)
			}
			c.internal[key] = mark
			mk := ServiceKey{IPv6: key.IPv6, FWMark: mark}
			c.services[mk] = svc(mk, internal)
		}
		if fe.Kind != dataplane.NodePort {
			c.bind = append(c.bind, key.Addr)
			c.entries = append(c.entries, setEntry{setName(setBound, key.IPv6), Entry{Addr: key.Addr}})
			if sp.HealthCheckNodePort != 0 {
				c.entries = append(c.entries, setEntry{setName(setHealthCheck, key.IPv6),
					Entry{Addr: key.Addr, Proto: dataplane.TCP, Port: sp.HealthCheckNodePort}})
			}
		}
		e := Entry{Addr: key.Addr, Proto: key.Proto, Port: key.Port}
		role := setExternal
		switch {
		case fe.Kind == dataplane.ClusterIP:
			role = setClusterIP
		case fe.ExternalBackends != nil:
			role = setExternalLocal
		}
		c.entries = append(c.entries, setEntry{setName(role, key.IPv6), e})
		if ranges := sp.SourceRangesFor(fe); len(ranges) > 0 {
			c.entries = append(c.entries, setEntry{setName(setFirewall, key.IPv6), e})
			for _, r := range ranges {
				re := e
				re.Net = r
				c.entries = append(c.entries, setEntry{setName(setSourceCIDR, key.IPv6), re})
			}
		}
		for _, b := range slices.Concat(internal, external) {
			c.entries = append(c.entries, setEntry{setName(setLoopBack, key.IPv6),
				Entry{Addr: b.Addr, Proto: key.Proto, Port: b.Port, Addr2: b.Addr}})
		}
	}
	return c, nil
}

// servable reports whether IPVS can serve fe. NodePorts on loopback
// addresses cannot be: IPVS does not forward packets from lo to other
// hosts, so kube-proxy's IPVS mode leaves them out too.
func servable(fe dataplane.Frontend) bool {
	return !(fe.Kind == dataplane.NodePort && fe.Addr.Unmap().IsLoopback())
}

// familyBackends are the backends of the family, unmapped, sorted and
// without duplicates: IPVS forwards a family's packets only to real
// servers of that family.
func familyBackends(bs []dataplane.Backend, ipv6 bool) []dataplane.Backend {
	out := []dataplane.Backend{}
	for _, b := range bs {
		a := b.Addr.Unmap()
		if a.Is4() != ipv6 {
			out = append(out, dataplane.Backend{Addr: a, Port: b.Port})
		}
	}
	slices.SortFunc(out, dataplane.Backend.Compare)
	return slices.Compact(out)
}

// preferredMark is where the search for a frontend's mark among limit
// marks starts, so that the same frontend tends to get the same mark in
// every process.
func preferredMark(k ServiceKey, limit uint32) uint32 {
	h := fnv.New32a()
	b, _ := k.Addr.MarshalBinary()
	h.Write(b)
	h.Write([]byte{byte(k.Proto), byte(k.Port >> 8), byte(k.Port)})
	return h.Sum32()%limit + 1
}

// marks tracks which frontend holds which firewall mark.
type marks struct {
	byKey  map[ServiceKey]uint32
	byMark map[uint32]ServiceKey
	// limit is how many marks it hands out (Limits.FirewallMarks).
	limit uint32
}

func newMarks(limit uint32) *marks {
	return &marks{byKey: map[ServiceKey]uint32{}, byMark: map[uint32]ServiceKey{}, limit: limit}
}

func (m *marks) clone() *marks {
	out := newMarks(m.limit)
	for k, v := range m.byKey {
		out.set(k, v)
	}
	return out
}

func (m *marks) set(k ServiceKey, mark uint32) {
	m.byKey[k] = mark
	m.byMark[mark] = k
}

// forget frees k's mark.
func (m *marks) forget(k ServiceKey) {
	if v, ok := m.byKey[k]; ok {
		delete(m.byKey, k)
		delete(m.byMark, v)
	}
}

// get returns k's mark, giving it a free one if it has none; 0 when all
// are taken.
func (m *marks) get(k ServiceKey) uint32 {
	if v, ok := m.byKey[k]; ok {
		return v
	}
	id := preferredMark(k, m.limit)
	for range m.limit {
		mark := masqMark | id
		if _, taken := m.byMark[mark]; !taken {
			m.set(k, mark)
			return mark
		}
		id = id%m.limit + 1
	}
	return 0
}

// tracking returns an allocator of m's marks that remembers the frontends
// it gave a new mark, and the function that frees those again, for a
// contribution that is refused.
func (m *marks) tracking() (alloc markAllocator, undo func()) {
	var given []ServiceKey
	alloc = func(k ServiceKey) uint32 {
		_, had := m.byKey[k]
		mark := m.get(k)
		if !had && mark != 0 {
			given = append(given, k)
		}
		return mark
	}
	return alloc, func() {
		for _, k := range given {
			m.forget(k)
		}
	}
}
