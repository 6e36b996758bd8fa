package desired

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/dataplane"
)

// chooser turns fuzzer bytes into choices; it returns zero choices once the
// bytes run out, so every input builds some object.
type chooser struct{ data []byte }

func (c *chooser) next() byte {
	if len(c.data) == 0 {
		return 0
	}
	b := c.data[0]
	c.data = c.data[1:]
	return b
}

func (c *chooser) intn(n int) int { return int(c.next()) % n }
func (c *chooser) bool() bool     { return c.next()&1 == 1 }

func choose[T any](c *chooser, options ...T) T { return options[c.intn(len(options))] }

// maybe returns nil (one time in eight) or a pointer to one of the options.
func maybe[T any](c *chooser, options ...T) *T {
	if c.intn(8) == 0 {
		return nil
	}
	v := choose(c, options...)
	return &v
}

// fuzzInputs are the fuzzer's free-form values, mixed into the choices so
// that parsing meets arbitrary strings and numbers.
type fuzzInputs struct {
	addr1, addr2 string
	num          int32
}

// addr is mostly a usable address (the translation has to have something
// to work with), sometimes a malformed or odd one.
func (in fuzzInputs) addr(c *chooser) string {
	if c.intn(4) != 0 {
		return choose(c, "10.96.0.10", "10.1.0.1", "10.1.0.2", "10.1.0.3", "fd00:96::10", "fd00:1::1", "fd00:1::2",
			"203.0.113.7", "2001:db8::10")
	}
	return choose(c, "::ffff:10.1.0.2", "0.0.0.0", "::", "fe80::1%eth0", "bogus", "", "127.0.0.1", in.addr1, in.addr2)
}

// endpointAddr is mostly an address of the slice's family.
func (in fuzzInputs) endpointAddr(c *chooser, at discoveryv1.AddressType) string {
	switch {
	case c.intn(4) == 0:
		return in.addr(c)
	case at == discoveryv1.AddressTypeIPv6:
		return choose(c, "fd00:1::1", "fd00:1::2", "fd00:1::3")
	}
	return choose(c, "10.1.0.1", "10.1.0.2", "10.1.0.3")
}

// port is mostly a valid port number.
func (in fuzzInputs) port(c *chooser) int32 {
	if c.intn(4) != 0 {
		return choose[int32](c, 53, 80, 8080, 30080)
	}
	return choose(c, 0, 65535, 65536, -1, in.num)
}

func (in fuzzInputs) service(c *chooser) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	if c.intn(8) == 0 {
		s.Labels = map[string]string{choose(c, LabelServiceProxyName, "app"): ""}
	}
	spec := &s.Spec
	spec.Type = choose(c, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeLoadBalancer,
		v1.ServiceTypeNodePort, v1.ServiceTypeClusterIP, v1.ServiceTypeExternalName, "")
	switch c.intn(4) {
	case 0: // anything goes
		for range c.intn(4) {
			spec.ClusterIPs = append(spec.ClusterIPs, in.addr(c))
		}
		for range c.intn(3) {
			spec.IPFamilies = append(spec.IPFamilies, choose(c, v1.IPv4Protocol, v1.IPv6Protocol, "IPv5"))
		}
		spec.ClusterIP = choose(c, "10.96.0.10", "None", "", in.addr1)
	case 1:
		spec.ClusterIPs, spec.IPFamilies = []string{"10.96.0.10"}, []v1.IPFamily{v1.IPv4Protocol}
	case 2:
		spec.ClusterIPs, spec.IPFamilies = []string{"fd00:96::10"}, []v1.IPFamily{v1.IPv6Protocol}
	case 3:
		spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
		spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	}
	if len(spec.ClusterIPs) > 0 {
		spec.ClusterIP = spec.ClusterIPs[0]
	}
	for range 1 + c.intn(3) {
		spec.Ports = append(spec.Ports, v1.ServicePort{
			Name:     choose(c, "", "http", "dns"),
			Protocol: choose(c, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "", "bogus"),
			Port:     in.port(c),
			NodePort: in.port(c),
		})
	}
	for range c.intn(3) {
		spec.ExternalIPs = append(spec.ExternalIPs, in.addr(c))
	}
	for range c.intn(3) {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{
			IP:     in.addr(c),
			IPMode: maybe(c, v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy, "odd"),
		})
	}
	spec.ExternalTrafficPolicy = choose(c, v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal, "")
	spec.InternalTrafficPolicy = maybe(c, v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal)
	spec.PublishNotReadyAddresses = c.intn(4) == 0
	if c.bool() {
		spec.SessionAffinity = v1.ServiceAffinityClientIP
		if c.bool() {
			spec.SessionAffinityConfig = &v1.SessionAffinityConfig{}
			if c.bool() {
				spec.SessionAffinityConfig.ClientIP = &v1.ClientIPConfig{TimeoutSeconds: maybe(c, 1, 10800, 0, -5, in.num)}
			}
		}
	}
	return s
}

func (in fuzzInputs) slice(c *chooser, name string, svc *v1.Service) *discoveryv1.EndpointSlice {
	if c.intn(16) == 0 {
		return nil
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: choose(c, "ns", "ns", "ns", "ns", "ns", "ns", "ns", "other"),
			Name:      name,
			Labels:    map[string]string{discoveryv1.LabelServiceName: choose(c, "web", "web", "web", "web", "web", "web", "api", "")},
		},
		AddressType: choose(c, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeIPv4,
			discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN, "odd"),
	}
	if c.intn(16) == 0 {
		s.Labels[v1.IsHeadlessService] = ""
	}
	for range 1 + c.intn(3) {
		p := discoveryv1.EndpointPort{
			Name:     maybe(c, "", "http", "dns", "metrics"),
			Protocol: maybe(c, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "bogus"),
			Port:     maybe(c, in.port(c)),
		}
		// Mostly echo a Service port, as the EndpointSlice controller does,
		// so that endpoints get joined to it.
		if n := len(svc.Spec.Ports); n > 0 && c.intn(4) != 0 {
			sp := svc.Spec.Ports[c.intn(n)]
			p.Name, p.Protocol = &sp.Name, &sp.Protocol
		}
		s.Ports = append(s.Ports, p)
	}
	for range c.intn(6) {
		var e discoveryv1.Endpoint
		for range c.intn(3) + choose(c, 1, 1, 1, 0) {
			e.Addresses = append(e.Addresses, in.endpointAddr(c, s.AddressType))
		}
		e.Conditions = discoveryv1.EndpointConditions{
			Ready: maybe(c, true, false), Serving: maybe(c, true, false), Terminating: maybe(c, true, false),
		}
		e.NodeName = maybe(c, "node-a", "node-b", "")
		if c.bool() {
			e.Hints = &discoveryv1.EndpointHints{}
			for range c.intn(3) {
				e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: choose(c, "zone-a", "zone-b", "")})
			}
			for range c.intn(3) {
				e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: choose(c, "node-a", "node-b", "")})
			}
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

func (in fuzzInputs) node(c *chooser) Node {
	n := Node{Name: choose(c, "node-a", "node-b", ""), Zone: choose(c, "zone-a", "zone-b", "")}
	for range c.intn(4) {
		a, _ := netip.ParseAddr(in.addr(c)) // invalid strings give the zero Addr, also a case
		n.Addresses = append(n.Addresses, a)
	}
	return n
}

func FuzzTranslate(f *testing.F) {
	f.Add([]byte{}, "", "", int32(0))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, "10.1.0.9", "fd00::9", int32(443))
	f.Add([]byte("a NodePort dual-stack service with several slices and endpoints, long enough to fill it in"), "1.2.3.4", "::1", int32(30000))
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255}, "::ffff:1.2.3.4", "x", int32(-7))
	// Long pseudo-random seeds: about one in ten frontends they build has
	// backends, a better start for the mutator than short inputs.
	r := rand.New(rand.NewPCG(1, 2))
	for range 32 {
		seed := make([]byte, 256)
		for i := range seed {
			seed[i] = byte(r.Uint32())
		}
		f.Add(seed, "10.1.0.9", "fd00:1::9", int32(r.Int32N(70000)))
	}

	f.Fuzz(func(t *testing.T, data []byte, addr1, addr2 string, num int32) {
		in := fuzzInputs{addr1: addr1, addr2: addr2, num: num}
		c := &chooser{data: data}
		svc := in.service(c)
		var sl []*discoveryv1.EndpointSlice
		for i := range c.intn(5) {
			sl = append(sl, in.slice(c, "s"+strconv.Itoa(i), svc)) // unique names, as in a real cluster
		}
		node := in.node(c)

		got, facts, _ := Translate(svc, sl, node)
		if skip, _ := SkipService(svc); skip && got != nil {
			t.Fatalf("skipped Service translated to %v", render(got))
		}
		checkInvariants(t, svc, got)
		checkFacts(t, svc, sl, node, got, facts)

		// Deterministic, and independent of the slices' order.
		again, againFacts, _ := Translate(svc, sl, node)
		rev := slices.Clone(sl)
		slices.Reverse(rev)
		reversed, reversedFacts, _ := Translate(svc, rev, node)
		for _, other := range [][]PortFacts{againFacts, reversedFacts} {
			if !reflect.DeepEqual(other, facts) {
				t.Fatalf("facts differ: %+v vs %+v", facts, other)
			}
		}
		for _, other := range [][]dataplane.ServicePort{again, reversed} {
			if len(other) != len(got) {
				t.Fatalf("translations differ in length: %d vs %d", len(got), len(other))
			}
			for i := range got {
				if !Equal(&got[i], &other[i]) {
					t.Fatalf("translations differ:\n%v\nvs\n%v", render(got[i:i+1]), render(other[i:i+1]))
				}
			}
		}
	})
}

// checkInvariants verifies what must hold for any translation, whatever the
// input: the properties the dataplane relies on.
func checkInvariants(t *testing.T, svc *v1.Service, got []dataplane.ServicePort) {
	t.Helper()
	for i, sp := range got {
		if i > 0 && got[i-1].Name.Compare(sp.Name) >= 0 {
			t.Errorf("ports not sorted or duplicated: %v then %v", got[i-1].Name, sp.Name)
		}
		if sp.Name.Namespace != svc.Namespace || sp.Name.Name != svc.Name {
			t.Errorf("port %v does not name Service %s/%s", sp.Name, svc.Namespace, svc.Name)
		}
		if sp.Name.Protocol != dataplane.TCP && sp.Name.Protocol != dataplane.UDP {
			t.Errorf("port %v has protocol %v; only TCP and UDP are supported", sp.Name, sp.Name.Protocol)
		}
		if (sp.AffinityTimeout != 0) != (svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP) || sp.AffinityTimeout < 0 {
			t.Errorf("port %v affinity %v for sessionAffinity %q", sp.Name, sp.AffinityTimeout, svc.Spec.SessionAffinity)
		}
		if !slices.ContainsFunc(specPortsNamed(svc, sp.Name), func(p *v1.ServicePort) bool {
			return frontendPortsFrom(p, sp.Frontends)
		}) {
			t.Errorf("%v: frontend ports are not the port and node port of any Service port: %v", sp.Name, render(got[i:i+1]))
		}
		seen := map[netip.AddrPort]bool{}
		for j, f := range sp.Frontends {
			if j > 0 && compareFrontends(sp.Frontends[j-1], f) >= 0 {
				t.Errorf("%v: frontends not sorted", sp.Name)
			}
			if seen[f.AddrPort()] {
				t.Errorf("%v: frontend %v twice", sp.Name, f.AddrPort())
			}
			seen[f.AddrPort()] = true
			if !f.Addr.IsValid() || f.Addr.Is4In6() || f.Addr.Zone() != "" || f.Addr.IsUnspecified() {
				t.Errorf("%v: bad frontend address %v", sp.Name, f.Addr)
			}
			if f.Protocol != sp.Name.Protocol {
				t.Errorf("%v: frontend %v has protocol %v", sp.Name, f.AddrPort(), f.Protocol)
			}
			if f.Backends == nil {
				t.Errorf("%v: frontend %v has nil Backends", sp.Name, f.AddrPort())
			}
			checkBackends(t, sp.Name, f, f.Backends)
			checkBackends(t, sp.Name, f, f.ExternalBackends)
			externalLocal := (svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer) &&
				svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
			if wantExt := externalLocal && f.Kind != dataplane.ClusterIP; (f.ExternalBackends != nil) != wantExt {
				t.Errorf("%v: %v frontend ExternalBackends = %v, want set: %v", sp.Name, f.Kind, f.ExternalBackends, wantExt)
			}
		}
	}
}

// checkFacts verifies that the facts agree with what the frontends show.
// Where the frontends cannot tell (a Local ClusterIP frontend without
// backends), HasEndpoints must be what the ClusterIP frontends show when the
// same input is translated with internalTrafficPolicy: Cluster.
func checkFacts(t *testing.T, svc *v1.Service, sl []*discoveryv1.EndpointSlice, node Node, got []dataplane.ServicePort, facts []PortFacts) {
	t.Helper()
	if len(facts) != len(got) {
		t.Fatalf("%d facts for %d ports", len(facts), len(got))
	}
	if len(got) == 0 {
		return
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	clusterPolicy := svc.DeepCopy()
	clusterPolicy.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyCluster)
	asCluster, _, _ := Translate(clusterPolicy, sl, node)
	for i, sp := range got {
		if clusterWide := slices.ContainsFunc(asCluster[i].Frontends, func(fe dataplane.Frontend) bool {
			return fe.Kind == dataplane.ClusterIP && len(fe.Backends) > 0
		}); facts[i].HasEndpoints != clusterWide {
			t.Errorf("%v: HasEndpoints %v, but under the Cluster policy ClusterIP backends: %v", sp.Name, facts[i].HasEndpoints, clusterWide)
		}
	}
	for i, sp := range got {
		f := facts[i]
		anyBackends := slices.ContainsFunc(sp.Frontends, func(fe dataplane.Frontend) bool { return len(fe.Backends) > 0 })
		clusterIPBackends := slices.ContainsFunc(sp.Frontends, func(fe dataplane.Frontend) bool {
			return fe.Kind == dataplane.ClusterIP && len(fe.Backends) > 0
		})
		externalDropped := slices.ContainsFunc(sp.Frontends, func(fe dataplane.Frontend) bool {
			return fe.ExternalBackends != nil && len(fe.ExternalBackends) == 0 && len(fe.Backends) > 0
		})
		switch {
		case anyBackends && !f.HasEndpoints:
			t.Errorf("%v: frontends have backends but HasEndpoints is false: %+v", sp.Name, f)
		case f.HasInternalEndpoints != clusterIPBackends:
			t.Errorf("%v: HasInternalEndpoints %v, but ClusterIP frontends with backends: %v", sp.Name, f.HasInternalEndpoints, clusterIPBackends)
		case !internalLocal && f.HasInternalEndpoints != f.HasEndpoints:
			t.Errorf("%v: internalTrafficPolicy Cluster, yet HasInternalEndpoints %v != HasEndpoints %v", sp.Name, f.HasInternalEndpoints, f.HasEndpoints)
		case f.HasExternalEndpoints != (f.HasEndpoints && !externalDropped):
			t.Errorf("%v: HasExternalEndpoints %v, HasEndpoints %v, an external frontend drops outside traffic: %v",
				sp.Name, f.HasExternalEndpoints, f.HasEndpoints, externalDropped)
		}
	}
}

// checkBackends: valid, of the frontend's family, sorted, no duplicates.
func checkBackends(t *testing.T, name dataplane.ServicePortName, f dataplane.Frontend, bs []dataplane.Backend) {
	t.Helper()
	for k, b := range bs {
		if !b.Addr.IsValid() || b.Addr.Is4() != f.Addr.Is4() || b.Addr.Is4In6() || b.Addr.IsUnspecified() {
			t.Errorf("%v: frontend %v has backend %v of the wrong family or invalid", name, f.AddrPort(), b)
		}
		if b.Port == 0 {
			t.Errorf("%v: backend %v with port 0", name, b)
		}
		if k > 0 && bs[k-1].Compare(b) >= 0 {
			t.Errorf("%v: frontend %v backends not sorted or duplicated: %v", name, f.AddrPort(), bs)
		}
	}
}

// specPortsNamed returns the Service ports a translated port may come from:
// those with its name and protocol (invalid duplicates are possible input).
func specPortsNamed(svc *v1.Service, name dataplane.ServicePortName) []*v1.ServicePort {
	var out []*v1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		proto, err := parseProtocol(string(p.Protocol))
		if err == nil && p.Name == name.Port && proto == name.Protocol {
			out = append(out, p)
		}
	}
	return out
}

// frontendPortsFrom reports whether every frontend's port is the Service
// port (or, for NodePort frontends, the node port) of p.
func frontendPortsFrom(p *v1.ServicePort, fs []dataplane.Frontend) bool {
	for _, f := range fs {
		want := p.Port
		if f.Kind == dataplane.NodePort {
			want = p.NodePort
		}
		if f.Port == 0 || int32(f.Port) != want {
			return false
		}
	}
	return true
}
