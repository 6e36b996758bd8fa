// Package desired translates Kubernetes API objects (a Service, its
// EndpointSlices and this node's facts) into kpr's desired dataplane state,
// following kube-proxy's Service semantics. Everything here is a pure
// function of its inputs: no clients, no clocks, no globals.
//
// The reference is upstream kube-proxy (k8s.io/kubernetes/pkg/proxy): the
// service and endpoints change trackers decide what is proxied at all, and
// CategorizeEndpoints decides which endpoints serve which traffic. Where
// upstream handles each IP family in a separate proxier, kpr does the same
// work per family inside one translation, so every frontend only ever gets
// backends of its own family.
package desired

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpr-io/kpr/dataplane"
)

// LabelServiceProxyName marks a Service that another proxy implements;
// kube-proxy (and so kpr) must leave it alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// Node is what the translation needs to know about the node kpr runs on.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label, empty if unset.
	Zone string
	// Addresses are the addresses NodePorts are served on, as
	// NodePortAddresses.Select picks them: node IPs and, where the
	// configuration allows, 127.0.0.1 and ::1. A loopback frontend is
	// for the node's own sockets: every backend serves it only inside the
	// node's network namespace (in a pod, 127.0.0.1 stays the pod's), as
	// kube-proxy's route_localnet rules do.
	Addresses []netip.Addr
	// IPs are all of the node's InternalIP and ExternalIP addresses: the
	// addresses ExternalIPsNodeLocal counts as this node's.
	IPs []netip.Addr
	// PrimaryIPs are the node's primary IP of each family (PrimaryIPs):
	// kube-proxy's node IP, which decides whether loadBalancerSourceRanges
	// let the node's own requests to a load-balancer IP through.
	PrimaryIPs []netip.Addr
	// ExternalIPs says which Service externalIPs are programmed.
	ExternalIPs ExternalIPPolicy
}

// Problem is a piece of API input that could not be used. The rest of the
// Service is still translated; problems are for logging and events.
type Problem struct {
	Object string // namespace/name of the Service or EndpointSlice
	Reason string
}

func (p Problem) String() string { return p.Object + ": " + p.Reason }

// SkipService reports whether kpr must ignore a Service entirely, and why:
// service-proxy-name label, headless, empty clusterIP, ExternalName.
func SkipService(svc *v1.Service) (skip bool, reason string) {
	if svc == nil {
		return true, "nil Service"
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return true, "labelled " + LabelServiceProxyName + ": it belongs to another proxy"
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return true, "type ExternalName is resolved by DNS, not proxied"
	}
	switch svc.Spec.ClusterIP {
	case v1.ClusterIPNone:
		return true, "headless (clusterIP: None)"
	case "":
		return true, "no clusterIP allocated"
	}
	return false, ""
}

// SkipSlice reports whether kpr must ignore an EndpointSlice entirely
// (headless label, FQDN address type, no service-name label). An address
// type other than IPv4 or IPv6 is skipped too: kpr cannot program it.
func SkipSlice(slice *discoveryv1.EndpointSlice) (skip bool, reason string) {
	if slice == nil {
		return true, "nil EndpointSlice"
	}
	if _, ok := slice.Labels[v1.IsHeadlessService]; ok {
		return true, "labelled " + v1.IsHeadlessService
	}
	if _, ok := SliceServiceName(slice); !ok {
		return true, "no " + discoveryv1.LabelServiceName + " label"
	}
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
		return false, ""
	case discoveryv1.AddressTypeFQDN:
		return true, "addressType FQDN is not proxied"
	}
	return true, "unknown addressType " + string(slice.AddressType)
}

// SliceServiceName returns the namespace/name of the Service an EndpointSlice
// belongs to, from its kubernetes.io/service-name label. ok is false when the
// slice is nil or the label is missing or empty. Watchers use it to group
// slices by Service.
func SliceServiceName(slice *discoveryv1.EndpointSlice) (key types.NamespacedName, ok bool) {
	if slice == nil {
		return types.NamespacedName{}, false
	}
	name := slice.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: slice.Namespace, Name: name}, true
}

// Translate computes the desired state of every port of svc from the slices
// that belong to it. It never panics on malformed input: unusable parts are
// reported as Problems and left out.
//
// A Service that SkipService rejects translates to nothing, without
// problems. Slices that SkipSlice rejects are ignored; slices of another
// Service are ignored with a Problem. The result is sorted (ports by name and
// protocol, frontends by kind, address and port, backends by address and
// port) so that equal inputs give equal outputs. facts[i] describes
// ports[i], for the metrics.
func Translate(svc *v1.Service, slices []*discoveryv1.EndpointSlice, node Node) (ports []dataplane.ServicePort, facts []PortFacts, problems []Problem) {
	return translate(svc, slices, node, nil)
}

// translate is Translate; ex, when not nil, records why each endpoint is
// used or left out (see Explain). nil costs nothing.
func translate(svc *v1.Service, slices []*discoveryv1.EndpointSlice, node Node, ex *explainer) (ports []dataplane.ServicePort, facts []PortFacts, problems []Problem) {
	if skip, _ := SkipService(svc); skip {
		return nil, nil, nil
	}
	t := translation{svc: svc, node: node, svcObject: svc.Namespace + "/" + svc.Name, explain: ex}
	t.families = t.serviceFamilies()
	t.servicePolicies()
	t.frontendAddrs()
	t.ranges = t.sourceRanges()
	t.slices = t.parseSlices(slices)
	ports, facts = t.servicePorts()
	return ports, facts, t.problems
}

// translation carries the state of one Translate call.
type translation struct {
	svc       *v1.Service
	node      Node
	svcObject string

	// families maps each IP family the Service has to its cluster IP.
	families map[family]netip.Addr
	// Service-wide settings shared by every port.
	internalLocal bool // internalTrafficPolicy: Local
	externalLocal bool // externalTrafficPolicy: Local on a NodePort/LoadBalancer Service
	affinity      time.Duration
	nodeAddrs     map[family][]netip.Addr // NodePort addresses, loopback included
	externalAddrs map[family][]externalAddr
	ranges        []netip.Prefix // loadBalancerSourceRanges, parsed (sourceRanges)

	slices   []parsedSlice
	problems []Problem

	// explain, when not nil, collects the decisions Explain reports.
	explain *explainer
}

func (t *translation) problem(object, reason string) {
	t.problems = append(t.problems, Problem{Object: object, Reason: reason})
}

// family is an IP family; kpr keeps the two entirely apart, as kube-proxy
// runs one proxier per family.
type family uint8

const (
	ipv4 family = 4
	ipv6 family = 6
)

func (f family) String() string {
	if f == ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// parseIP parses an IP the way the API stores it. It unmaps IPv4-mapped IPv6
// addresses (kube-proxy treats those as IPv4) and rejects zoned, unspecified
// and malformed addresses, which cannot be programmed.
func parseIP(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	if a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}

// serviceFamilies returns the Service's families and their cluster IPs, from
// spec.clusterIPs (spec.clusterIP for objects written before dual-stack).
// When spec.ipFamilies is set, a cluster IP of a family it does not list is
// reported and ignored, as is a second cluster IP of one family.
func (t *translation) serviceFamilies() map[family]netip.Addr {
	spec := &t.svc.Spec
	ips := spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{spec.ClusterIP}
	}
	declared := map[family]bool{}
	for _, f := range spec.IPFamilies {
		switch f {
		case v1.IPv4Protocol:
			declared[ipv4] = true
		case v1.IPv6Protocol:
			declared[ipv6] = true
		}
	}
	families := map[family]netip.Addr{}
	for _, s := range ips {
		a, ok := parseIP(s)
		if !ok {
			t.problem(t.svcObject, "cluster IP "+quote(s)+" is not a valid IP address")
			continue
		}
		f := familyOf(a)
		if len(spec.IPFamilies) > 0 && !declared[f] {
			t.problem(t.svcObject, "cluster IP "+a.String()+" is "+f.String()+", which spec.ipFamilies does not list")
			continue
		}
		if prev, dup := families[f]; dup {
			t.problem(t.svcObject, "second "+f.String()+" cluster IP "+a.String()+" ignored; using "+prev.String())
			continue
		}
		families[f] = a
	}
	return families
}

// sortedFamilies returns the keys of the families map in a fixed order.
func (t *translation) sortedFamilies() []family {
	var out []family
	for _, f := range []family{ipv4, ipv6} {
		if _, ok := t.families[f]; ok {
			out = append(out, f)
		}
	}
	return out
}

// servicePorts translates every usable port of the Service, sorted by
// name, and returns the facts of each beside it.
func (t *translation) servicePorts() ([]dataplane.ServicePort, []PortFacts) {
	if len(t.families) == 0 {
		return nil, nil
	}
	type translated struct {
		sp    dataplane.ServicePort
		facts PortFacts
	}
	seen := map[dataplane.ServicePortName]bool{}
	var all []translated
	for i := range t.svc.Spec.Ports {
		sp, facts, ok := t.servicePort(&t.svc.Spec.Ports[i])
		if !ok {
			continue
		}
		if seen[sp.Name] {
			t.problem(t.svcObject, "duplicate port "+sp.Name.String()+" ignored")
			continue
		}
		seen[sp.Name] = true
		all = append(all, translated{sp, facts})
	}
	if len(all) == 0 {
		return nil, nil
	}
	slices.SortFunc(all, func(a, b translated) int { return a.sp.Name.Compare(b.sp.Name) })
	ports := make([]dataplane.ServicePort, len(all))
	facts := make([]PortFacts, len(all))
	for i := range all {
		ports[i], facts[i] = all[i].sp, all[i].facts
	}
	return ports, facts
}

func quote(s string) string { return "\"" + s + "\"" }
