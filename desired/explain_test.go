package desired

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// decisionsOf returns "backend cluster=... local=..." per endpoint decision
// of the first port and family, keyed by backend, for compact asserts.
func decisionsOf(t *testing.T, ex *Explanation) map[string]EndpointDecision {
	t.Helper()
	out := map[string]EndpointDecision{}
	for _, p := range ex.Ports {
		for _, f := range p.Families {
			for _, d := range f.Endpoints {
				if _, dup := out[d.Backend]; dup {
					out[d.Backend+"#dup"] = d
					continue
				}
				out[d.Backend] = d
			}
		}
	}
	return out
}

func TestExplainReasons(t *testing.T) {
	cases := []struct {
		name    string
		svc     *v1.Service
		slices  []*discoveryv1.EndpointSlice
		cluster map[string]string // backend -> substring of its cluster decision
		local   map[string]string // backend -> substring of its local decision
	}{
		{
			name: "not ready, and terminating with ready peers",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1"), ep("10.1.0.2", notReady), ep("10.1.0.3", terminating(true)))},
			cluster: map[string]string{
				"10.1.0.1:8080": "used",
				"10.1.0.2:8080": "not ready",
				"10.1.0.3:8080": "terminating, and ready endpoints exist",
			},
		},
		{
			name: "terminating fallback when nothing is ready",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1", terminating(true)), ep("10.1.0.2", terminating(false)), ep("10.1.0.3", notReady))},
			cluster: map[string]string{
				"10.1.0.1:8080": "used: terminating fallback",
				"10.1.0.2:8080": "terminating and not serving",
				"10.1.0.3:8080": "not ready (and not terminating",
			},
		},
		{
			name: "zone hints for another zone",
			svc:  service(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose) }),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1", forZones("zone-a")), ep("10.1.0.2", forZones("zone-b")))},
			cluster: map[string]string{
				"10.1.0.1:8080": "used",
				"10.1.0.2:8080": "hinted for zone(s) zone-b, not this node's zone zone-a",
			},
		},
		{
			name: "node hints for another node",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1", forNodes("node-a")), ep("10.1.0.2", forNodes("node-b")))},
			cluster: map[string]string{"10.1.0.2:8080": "hinted for node(s) node-b, not this node node-a"},
		},
		{
			name: "not local under internalTrafficPolicy Local",
			svc:  service(internalLocal),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1", onNode("node-a")), ep("10.1.0.2", onNode("node-b")))},
			local: map[string]string{
				"10.1.0.1:8080": "used",
				"10.1.0.2:8080": "not local: on node node-b, not this node node-a",
			},
		},
		{
			name: "duplicate across slices: the local copy wins",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", v4, httpPort, ep("10.1.0.1", onNode("node-b"))),
				slice("s2", v4, httpPort, ep("10.1.0.1", onNode("node-a"))),
			},
			cluster: map[string]string{
				"10.1.0.1:8080":     "used",
				"10.1.0.1:8080#dup": "duplicate of 10.1.0.1:8080 in ns/s2",
			},
		},
		{
			name:    "IPv6 slice for an IPv4-only Service",
			svc:     service(),
			slices:  []*discoveryv1.EndpointSlice{slice("s6", discoveryv1.AddressTypeIPv6, httpPort, ep("fd00::1"))},
			cluster: map[string]string{"[fd00::1]:8080": "wrong address family"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ports, _, ex := Explain(c.svc, c.slices, thisNode)
			wantPorts, _, _ := Translate(c.svc, c.slices, thisNode)
			if got, want := strings.Join(render(ports), "\n"), strings.Join(render(wantPorts), "\n"); got != want {
				t.Fatalf("Explain's result differs from Translate's:\n%s\nwant\n%s", got, want)
			}
			got := decisionsOf(t, ex)
			for backend, want := range c.cluster {
				if d, ok := got[backend]; !ok || !strings.Contains(d.Cluster, want) {
					t.Errorf("%s cluster decision = %q, want it to contain %q (all: %+v)", backend, d.Cluster, want, got)
				}
			}
			for backend, want := range c.local {
				if d, ok := got[backend]; !ok || !strings.Contains(d.Local, want) {
					t.Errorf("%s local decision = %q, want it to contain %q", backend, d.Local, want)
				}
			}
		})
	}
}

func TestExplainSlicesAndEndpointsLeftOut(t *testing.T) {
	fqdn := slice("names", discoveryv1.AddressTypeFQDN, httpPort, ep("web.example.com"))
	wrong := slice("s1", v4, httpPort, ep("fd00::9"), ep("10.1.0.1"))
	_, _, ex := Explain(service(withAffinity(ptr(int32(600)))), []*discoveryv1.EndpointSlice{fqdn, wrong}, thisNode)
	if len(ex.Slices) != 1 || ex.Slices[0].Slice != "ns/names" || !strings.Contains(ex.Slices[0].Reason, "FQDN") {
		t.Errorf("ignored slices = %+v, want ns/names for its FQDN address type", ex.Slices)
	}
	if len(ex.Rejected) != 1 || ex.Rejected[0].Address != "fd00::9" || !strings.Contains(ex.Rejected[0].Reason, "is not IPv4") {
		t.Errorf("rejected endpoints = %+v, want fd00::9 for its family", ex.Rejected)
	}
	if ex.AffinitySeconds != 600 {
		t.Errorf("affinity = %d s, want 600", ex.AffinitySeconds)
	}
	if len(ex.Ports) != 1 || len(ex.Ports[0].Frontends) != 1 || ex.Ports[0].Frontends[0].Frontend != "10.96.0.10:80/TCP" ||
		strings.Join(ex.Ports[0].Frontends[0].Backends, ",") != "10.1.0.1:8080" {
		t.Errorf("frontends = %+v, want 10.96.0.10:80/TCP -> 10.1.0.1:8080", ex.Ports)
	}
}

func TestExplainSkippedService(t *testing.T) {
	svc := service(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, nil })
	_, _, ex := Explain(svc, nil, thisNode)
	if !strings.Contains(ex.Skipped, "headless") {
		t.Errorf("Skipped = %q, want headless", ex.Skipped)
	}
}

// Each decision names the slice its endpoint came from; a duplicate names
// both copies' slices.
func TestExplainNamesSlices(t *testing.T) {
	sl := []*discoveryv1.EndpointSlice{
		slice("s1", v4, httpPort, ep("10.1.0.1", onNode("node-b")), ep("10.1.0.2")),
		slice("s2", v4, httpPort, ep("10.1.0.1", onNode("node-a"))),
	}
	_, _, ex := Explain(service(), sl, thisNode)
	got := decisionsOf(t, ex)
	if got["10.1.0.1:8080"].Slice != "ns/s2" || got["10.1.0.1:8080#dup"].Slice != "ns/s1" || got["10.1.0.2:8080"].Slice != "ns/s1" {
		t.Errorf("slices of the decisions = %+v, want the used 10.1.0.1 from ns/s2, its duplicate and 10.1.0.2 from ns/s1", got)
	}
}
