package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/dataplane"
)

// externalAddr is a Service-wide frontend address that is not a cluster IP
// (an external IP or a load-balancer ingress IP).
type externalAddr struct {
	addr netip.Addr
	kind dataplane.FrontendKind
}

// servicePort translates one port of the Service. ok is false when the port
// itself is unusable (a Problem says why).
func (t *translation) servicePort(p *v1.ServicePort) (sp dataplane.ServicePort, facts PortFacts, ok bool) {
	label := portLabel(p)
	proto, err := parseProtocol(string(p.Protocol))
	if err != nil {
		t.problem(t.svcObject, label+": "+err.Error())
		return sp, facts, false
	}
	if proto == dataplane.SCTP {
		t.problem(t.svcObject, label+": SCTP is not supported by kpr; port left out")
		return sp, facts, false
	}
	port, valid := portNumber(p.Port)
	if !valid {
		t.problem(t.svcObject, fmt.Sprintf("%s: service port %d is out of range 1-65535", label, p.Port))
		return sp, facts, false
	}
	sp.Name = dataplane.ServicePortName{Namespace: t.svc.Namespace, Name: t.svc.Name, Port: p.Name, Protocol: proto}
	sp.AffinityTimeout = t.affinity
	sp.SourceRanges = slices.Clone(t.ranges)
	sp.HealthCheckNodePort = t.healthCheckNodePort()

	nodePort := t.nodePort(p, label)
	endpoints := t.endpointsFor(p.Name, proto)
	seen := map[netip.AddrPort]dataplane.FrontendKind{}
	// add reports whether f was added, rather than folded into an earlier
	// frontend at its address.
	add := func(f dataplane.Frontend) bool {
		if kind, dup := seen[f.AddrPort()]; dup {
			if kind != f.Kind {
				t.problem(t.svcObject, fmt.Sprintf("%s: %s frontend %s is already the %s frontend; kept as %s",
					label, f.Kind, f.AddrPort(), kind, kind))
			}
			return false
		}
		seen[f.AddrPort()] = f.Kind
		sp.Frontends = append(sp.Frontends, f)
		return true
	}

	// externalDropped: an external frontend drops outside traffic although
	// its family has endpoints.
	externalDropped := false
	for _, fam := range t.sortedFamilies() {
		sets := categorize(endpoints[fam], t.node)
		internal := sets.cluster
		if t.internalLocal {
			internal = sets.local
		}
		add(dataplane.Frontend{
			Addr: t.families[fam], Port: port, Protocol: proto, Kind: dataplane.ClusterIP,
			Backends: slices.Clone(internal),
		})
		if !sets.localTerminating {
			for _, b := range sets.local {
				facts.LocalReady = append(facts.LocalReady, b.Addr)
			}
		}
		facts.HasEndpoints = facts.HasEndpoints || len(sets.cluster) > 0
		facts.HasInternalEndpoints = facts.HasInternalEndpoints || len(internal) > 0
		dropsExternal := t.externalLocal && len(sets.cluster) > 0 && len(sets.local) == 0

		// Traffic that starts on this node always uses the cluster-wide
		// set on external frontends; only traffic from outside the node is
		// kept local under externalTrafficPolicy: Local.
		external := func(addr netip.Addr, port uint16, kind dataplane.FrontendKind) dataplane.Frontend {
			f := dataplane.Frontend{
				Addr: addr, Port: port, Protocol: proto, Kind: kind,
				Backends: slices.Clone(sets.cluster),
			}
			if t.externalLocal {
				f.ExternalBackends = slices.Clone(sets.local)
			}
			return f
		}
		if nodePort != 0 {
			for _, a := range t.nodeAddrs[fam] {
				if add(external(a, nodePort, dataplane.NodePort)) && dropsExternal {
					externalDropped = true
				}
			}
		}
		for _, e := range t.externalAddrs[fam] {
			if add(external(e.addr, port, e.kind)) && dropsExternal {
				externalDropped = true
			}
		}
	}
	facts.HasExternalEndpoints = facts.HasEndpoints && !externalDropped
	slices.SortFunc(sp.Frontends, compareFrontends)
	return sp, facts, true
}

// nodePort returns the port's NodePort, or 0 when it has none: only
// NodePort and LoadBalancer Services have one (a LoadBalancer may opt out
// with allocateLoadBalancerNodePorts: false).
func (t *translation) nodePort(p *v1.ServicePort, label string) uint16 {
	if !hasNodePorts(t.svc) || p.NodePort == 0 {
		return 0
	}
	n, ok := portNumber(p.NodePort)
	if !ok {
		t.problem(t.svcObject, fmt.Sprintf("%s: nodePort %d is out of range 1-65535; no NodePort frontends", label, p.NodePort))
		return 0
	}
	return n
}

func hasNodePorts(svc *v1.Service) bool {
	return svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer
}

func portNumber(p int32) (uint16, bool) {
	if p < 1 || p > 65535 {
		return 0, false
	}
	return uint16(p), true
}

// portLabel names a Service port in problems.
func portLabel(p *v1.ServicePort) string {
	if p.Name != "" {
		return "port " + quote(p.Name)
	}
	return "port " + strconv.Itoa(int(p.Port))
}

// servicePolicies reads the Service-wide settings every port shares:
// traffic policies and session affinity.
func (t *translation) servicePolicies() {
	spec := &t.svc.Spec
	t.internalLocal = spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	// As upstream's ExternalPolicyLocal: the field only means something for
	// the Service types that accept external traffic through node ports.
	t.externalLocal = hasNodePorts(t.svc) && spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal

	if spec.SessionAffinity != v1.ServiceAffinityClientIP {
		return
	}
	secs := v1.DefaultClientIPServiceAffinitySeconds
	if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		if s := *c.ClientIP.TimeoutSeconds; s > 0 {
			secs = s
		} else {
			t.problem(t.svcObject, fmt.Sprintf("sessionAffinityConfig.clientIP.timeoutSeconds %d is not positive; using the default %d", s, secs))
		}
	}
	t.affinity = time.Duration(secs) * time.Second
}

// healthCheckNodePort is the Service's healthCheckNodePort where kpr's
// health server serves it (externalTrafficPolicy Local), else 0; an
// out-of-range value, which the API server never admits, is 0 too.
func (t *translation) healthCheckNodePort() uint16 {
	if !t.externalLocal {
		return 0
	}
	port, ok := portNumber(t.svc.Spec.HealthCheckNodePort)
	if !ok {
		return 0
	}
	return port
}

// frontendAddrs collects the Service-wide frontend addresses other than the
// cluster IPs, per family. Addresses of a family the Service does not have
// are left out, as kube-proxy's per-family proxiers do.
func (t *translation) frontendAddrs() {
	t.nodeAddrs = map[family][]netip.Addr{}
	if hasNodePorts(t.svc) {
		for _, a := range t.node.Addresses {
			if !a.IsValid() || a.Zone() != "" || a.Unmap().IsUnspecified() {
				continue
			}
			a = a.Unmap()
			if f := familyOf(a); t.hasFamily(f) {
				t.nodeAddrs[f] = append(t.nodeAddrs[f], a)
			}
		}
	}

	t.externalAddrs = map[family][]externalAddr{}
	addExternal := func(s string, kind dataplane.FrontendKind) {
		a, ok := parseIP(s)
		if !ok {
			t.problem(t.svcObject, fmt.Sprintf("%s address %s is not a valid IP address", kind, quote(s)))
			return
		}
		f := familyOf(a)
		if !t.hasFamily(f) {
			t.problem(t.svcObject, fmt.Sprintf("%s address %s is %s but the Service has no %s cluster IP; ignored", kind, a, f, f))
			return
		}
		t.externalAddrs[f] = append(t.externalAddrs[f], externalAddr{addr: a, kind: kind})
	}
	for _, s := range t.svc.Spec.ExternalIPs {
		if t.externalIPAllowed(s) {
			addExternal(s, dataplane.ExternalIP)
		}
	}
	for _, ing := range t.svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // a hostname-only ingress is not an address kpr can serve
		}
		// Only VIP-mode ingress is programmed: with ipMode Proxy the load
		// balancer delivers to nodes or pods itself, and capturing its IP
		// here would bypass it for in-cluster clients. Upstream also treats
		// unknown modes as not VIP.
		if ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP {
			if *ing.IPMode != v1.LoadBalancerIPModeProxy {
				t.problem(t.svcObject, fmt.Sprintf("load-balancer ingress %s has unknown ipMode %s; not programmed", ing.IP, quote(string(*ing.IPMode))))
			}
			continue
		}
		addExternal(ing.IP, dataplane.LoadBalancer)
	}
}

// externalIPAllowed applies the node's ExternalIPPolicy to one
// spec.externalIPs entry. A refused address gets no frontend at all, for
// the node's own sockets and for traffic from other machines alike, so
// connections to it go where they were addressed. Not a Problem: the
// Service is fine, the node is configured not to serve it.
func (t *translation) externalIPAllowed(s string) bool {
	switch t.node.ExternalIPs {
	case ExternalIPsNone:
		return false
	case ExternalIPsNodeLocal:
		a, ok := parseIP(s)
		// An invalid address is let through to be reported by addExternal.
		return !ok || slices.Contains(t.node.IPs, a)
	}
	return true
}

func (t *translation) hasFamily(f family) bool {
	_, ok := t.families[f]
	return ok
}
