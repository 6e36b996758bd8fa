package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

const (
	v4 = discoveryv1.AddressTypeIPv4
	v6 = discoveryv1.AddressTypeIPv6
)

// tcp80 is the usual Service port: 80 to the pods' TCP echo servers.
var tcp80 = kubeobj.Port{Name: "tcp", Port: 80, TargetPort: int32(tcpPort)}

// serviceScenarios are the Service semantics scenarios. ebpfOnly, when
// set, says why a scenario tests what only the eBPF mode does.
var serviceScenarios = []struct {
	name     string
	run      func(t *testing.T, f *fixture, ns string)
	ebpfOnly string
	// socketHooksOnly, when set, says why a scenario tests what only the
	// socket hooks do, and not the packet path of a bypassed client.
	socketHooksOnly string
}{
	{"basic", testBasic, "", ""},
	{"multiport", testMultiport, "", ""},
	{"scale", testScale, "", ""},
	{"recreate", testRecreate, "", ""},
	{"no-endpoints", testNoEndpoints, "", ""},
	{"terminating", testTerminating, "", ""},
	{"affinity", testAffinity, "", ""},
	{"internal-local", testInternalTrafficPolicyLocal, "", ""},
	{"topology", testTopology, "", ""},
	{"ignored", testIgnored, "", ""},
	{"udp", testUDP, "", ""},
	{"udp-stale-socket", testStaleUDPSocket, "destroying the connected UDP sockets of a removed backend is the eBPF mode's " +
		"(bpf_sock_destroy); the iptables and IPVS modes delete their conntrack entries instead, as kube-proxy does",
		"a bypassed pod's sockets are not the node's to destroy: the packet path moves its flow to a live backend at the next datagram, " +
			"as kube-proxy's conntrack cleanup does"},
	{"dual-stack", testDualStack, "", ""},
	{"nodeport", testNodePort, "", ""},
	{"external-ip", testExternalIPAll, "", ""},
}

// TestServices runs the Service semantics scenarios against one kpr per
// mode: eBPF (with the socket hooks' client, and with a bypassed pod on the
// packet path), iptables-nft, iptables-legacy, IPVS and nftables.
func TestServices(t *testing.T) {
	forEachMode(t, allModes, func(t *testing.T, m dataMode) {
		f := newModeFixture(t, m)
		for _, sc := range serviceScenarios {
			t.Run(sc.name, func(t *testing.T) {
				if !m.ebpf() && sc.ebpfOnly != "" {
					t.Skip(sc.ebpfOnly)
				}
				if m.packetPath && sc.socketHooksOnly != "" {
					t.Skip(sc.socketHooksOnly)
				}
				sc.run(t, f, f.namespace(t, sc.name))
				f.requireRunning(t)
			})
		}
		if m.packetPath {
			if t.Failed() {
				all, _ := f.kpr.Metrics()
				for _, l := range strings.Split(all, "\n") {
					if strings.HasPrefix(l, "kpr_tc_") {
						t.Log(l)
					}
				}
			}
			// The client's connections took the packet path, not the
			// socket hooks.
			for _, series := range []string{`kpr_tc_translations_total{direction="forward"}`, `kpr_sock_bypasses_total{hook="connect4"}`} {
				if v, err := f.kpr.Metric(series); err != nil || v == "0" {
					t.Errorf("%s = %q, %v after the scenarios; want the bypassed client's connections counted", series, v, err)
				}
			}
		}
	})
}

func testBasic(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b")
	// Pods are clients too.
	requireServes(t, tcpWho, f.pod("pod-c").NetNS, vip, "pod-a", "pod-b")
}

// testMultiport: two named ports with different target ports, one of them
// given by name in the Service (the slice carries the resolved number).
// Port 80 goes to the TCP echo servers, port 81 to the HTTP servers: a
// port landing on the other one's target fails to parse.
func testMultiport(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "multi",
		kubeobj.Port{Name: "echo", Port: 80, TargetPort: int32(tcpPort)},
		kubeobj.Port{Name: "web", Port: 81, TargetPort: int32(httpPort)})
	svc.Spec.Ports[1].TargetPort = intstr.FromString("http-alt")
	svc = f.createService(t, svc)
	slice := kubeobj.Slice(svc, "multi-1", v4, f.eps("pod-a", "pod-b", "pod-c")...)
	for i := range slice.Ports {
		if *slice.Ports[i].Name == "web" {
			slice.Ports[i].Port = ptr.To(int32(httpPort))
		}
	}
	f.applySlice(t, slice)

	waitServes(t, tcpWho, f.clientNS, clusterIP(t, svc, v1.IPv4Protocol, 80), "pod-a", "pod-b", "pod-c")
	requireServes(t, httpWho, f.clientNS, clusterIP(t, svc, v1.IPv4Protocol, 81), "pod-a", "pod-b", "pod-c")
}

// testScale scales up and down, and measures how quickly a backend removed
// from the slice stops getting new connections.
func testScale(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "scale", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a")

	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b", "pod-c")...)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b", "pod-c")

	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-c")...)
	written := time.Now()
	// The removed backend is gone once 50 consecutive connects miss it
	// (with it still in, that happens by chance with probability
	// (2/3)^50 < 1e-8). The time counted is from the API write returning
	// to the first of those connects.
	const streak = 50
	misses := 0
	var streakStart time.Time
	deadline := written.Add(convergeTimeout)
	for misses < streak {
		if time.Now().After(deadline) {
			t.Fatalf("pod-b still got new connections %s after it was removed from the slice", convergeTimeout)
		}
		before := time.Now()
		who, err := tcpWho(f.clientNS, vip)
		if err != nil {
			t.Fatal(err)
		}
		if who == "pod-b" {
			misses = 0
			continue
		}
		if misses == 0 {
			streakStart = before
		}
		misses++
	}
	took := streakStart.Sub(written)
	t.Logf("removed backend stopped getting connections %s after the slice update returned", took)
	if took >= time.Second {
		t.Errorf("removed backend got new connections for %s after the slice update, want < 1s", took)
	}
	requireServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-c")

	// Down to nothing and back up.
	f.setEndpoints(t, svc, v4)
	f.waitRefused(t, f.clientNS, vip, false)
	f.setEndpoints(t, svc, v4, f.eps("pod-d")...)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-d")
}

// testRecreate deletes a Service (and its slice, as the garbage collector
// would) and creates it again with the same name and ClusterIP.
func testRecreate(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "again", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b")

	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.client.DiscoveryV1().EndpointSlices(ns).Delete(f.ctx, "again-ipv4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, convergeTimeout, "the deleted Service's ClusterIP is no longer translated", func() error {
		if f.hasFrontend(t, vip.Addr()) {
			return fmt.Errorf("%s still programmed", vip.Addr())
		}
		return nil
	})
	f.requireUntranslated(t, f.clientNS, vip)

	// The allocator may hold the freed IP for a moment.
	again := kubeobj.Service(ns, "again", tcp80)
	again.Spec.ClusterIP = vip.Addr().String()
	waitUntil(t, convergeTimeout, "recreate the Service with its old ClusterIP", func() error {
		out, err := f.client.CreateService(f.ctx, again.DeepCopy())
		if err == nil {
			svc = out
		}
		return err
	})
	f.setEndpoints(t, svc, v4, f.eps("pod-c")...)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-c")
}

// testNoEndpoints: a Service without endpoints rejects connections at
// once, whether it has no slice or an empty one, for TCP and UDP.
func testNoEndpoints(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "empty", tcp80,
		kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}))
	tcpVIP, udpVIP := clusterIP(t, svc, v1.IPv4Protocol, 80), clusterIP(t, svc, v1.IPv4Protocol, 53)
	f.waitRefused(t, f.clientNS, tcpVIP, false)
	f.waitRefused(t, f.clientNS, udpVIP, true)
	f.waitRefused(t, f.pod("pod-a").NetNS, tcpVIP, false)

	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	waitServes(t, tcpWho, f.clientNS, tcpVIP, "pod-a")
	f.setEndpoints(t, svc, v4)
	f.waitRefused(t, f.clientNS, tcpVIP, false)
	f.waitRefused(t, f.clientNS, udpVIP, true)
}

// testTerminating: with no ready endpoint, serving terminating ones are
// used; terminating ones that no longer serve are not.
func testTerminating(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "term", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	terminatingServing := conditions(false, true, true)
	terminatingGone := conditions(false, false, true)

	// A ready endpoint wins over terminating ones.
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4), f.ep("pod-b", v4, terminatingServing), f.ep("pod-c", v4, terminatingServing))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a")

	f.setEndpoints(t, svc, v4, f.ep("pod-b", v4, terminatingServing), f.ep("pod-c", v4, terminatingServing))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-b", "pod-c")

	f.setEndpoints(t, svc, v4, f.ep("pod-b", v4, terminatingServing), f.ep("pod-c", v4, terminatingGone))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-b")

	f.setEndpoints(t, svc, v4, f.ep("pod-b", v4, terminatingGone), f.ep("pod-c", v4, terminatingGone))
	f.waitRefused(t, f.clientNS, vip, false)
}

// testAffinity: with ClientIP affinity every client (a network namespace)
// sticks to one backend; turning it off spreads connections again.
func testAffinity(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "sticky", tcp80))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b", "pod-c")...)
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b", "pod-c")

	f.updateService(t, svc, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
	})
	for _, client := range []string{"node", "pod-d"} {
		nsh := f.clientNS
		if client != "node" {
			nsh = f.pod(client).NetNS
		}
		// Affinity is on once a whole round reaches one backend: by chance
		// that has probability 3*(1/3)^40.
		var stuck string
		waitUntil(t, convergeTimeout, "client "+client+" sticks to one backend", func() error {
			seen, err := sample(tcpWho, nsh, vip, roundSize)
			if err != nil {
				return err
			}
			if len(seen) != 1 {
				return fmt.Errorf("answered by %v", seen)
			}
			for who := range seen {
				stuck = who
			}
			return nil
		})
		requireServes(t, tcpWho, nsh, vip, stuck)
	}
	if f.mode.iptables() {
		if save := f.iptablesSave(t, false); !strings.Contains(save, "--seconds 600") {
			t.Errorf("no rule of the iptables tables keeps affinity for 600 s:\n%s", save)
		}
	} else if f.mode.nftables {
		if list := f.nftList(t); !strings.Contains(list, "timeout 10m") {
			t.Errorf("no affinity set of kpr's nftables table keeps a client for 600 s:\n%s", list)
		}
	} else if f.mode.ipvs {
		key := ipvs.ServiceKey{Addr: vip.Addr(), Proto: dataplane.TCP, Port: vip.Port()}
		if vs := f.virtualServers(t)[key]; vs == nil || vs.Timeout != 600 {
			t.Errorf("IPVS virtual server %s = %+v, want one persistent for 600 s", key, vs)
		}
	} else if d := frontendsOf(f.dump(t), vip.Addr()); len(d) != 1 || d[0].AffinityTimeout != 600 {
		t.Errorf("kpr dump for %s = %+v, want one entry with affinityTimeoutSeconds 600", vip, d)
	}

	f.updateService(t, svc, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityNone
		s.Spec.SessionAffinityConfig = nil
	})
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b", "pod-c")
}

// testInternalTrafficPolicyLocal: only this node's endpoints serve the
// ClusterIP; with none here, connections are rejected.
func testInternalTrafficPolicyLocal(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "local", tcp80)
	svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	svc = f.createService(t, svc)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)

	f.setEndpoints(t, svc, v4,
		f.ep("pod-a", v4, onNode(nodeName)), f.ep("pod-b", v4, onNode(otherNode)), f.ep("pod-c", v4, onNode(nodeName)))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-c")

	f.setEndpoints(t, svc, v4, f.ep("pod-b", v4, onNode(otherNode)), f.ep("pod-c", v4, onNode(otherNode)))
	f.waitRefused(t, f.clientNS, vip, false)

	// Switching the policy back to Cluster uses them all.
	f.updateService(t, svc, func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
	})
	waitServes(t, tcpWho, f.clientNS, vip, "pod-b", "pod-c")
}

// testTopology: zone and node hints narrow the backends as kube-proxy's
// rules say, and incomplete hints disable the filter. The node carries
// the zone label nodeZone.
func testTopology(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "topo", tcp80)
	svc.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameZone)
	svc = f.createService(t, svc)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	inZone, elsewhere := zoneHints(nodeZone), zoneHints(otherZone)

	t.Log("zone hints: only the endpoints hinted for this node's zone")
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4, inZone), f.ep("pod-b", v4, elsewhere), f.ep("pod-c", v4, inZone))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-c")

	t.Log("one ready endpoint without hints: no filter")
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4, inZone), f.ep("pod-b", v4, elsewhere), f.ep("pod-c", v4))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b", "pod-c")

	t.Log("no hint for this zone: no filter")
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4, elsewhere), f.ep("pod-b", v4, elsewhere))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b")

	t.Log("not-ready endpoints do not count: hints of the ready ones apply")
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4, inZone), f.ep("pod-b", v4, elsewhere), f.ep("pod-c", v4, conditions(false, false, false)))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a")

	f.updateService(t, svc, func(s *v1.Service) {
		s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameNode)
	})
	t.Log("node hints (PreferSameNode): only the endpoints hinted for this node")
	f.setEndpoints(t, svc, v4,
		f.ep("pod-a", v4, nodeHints(nodeName), inZone),
		f.ep("pod-b", v4, nodeHints(otherNode), inZone),
		f.ep("pod-c", v4, nodeHints(otherNode), elsewhere))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a")

	t.Log("no node hint for this node: zone hints apply")
	f.setEndpoints(t, svc, v4,
		f.ep("pod-a", v4, nodeHints(otherNode), inZone),
		f.ep("pod-b", v4, nodeHints(otherNode), inZone),
		f.ep("pod-c", v4, nodeHints(otherNode), elsewhere))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b")

	t.Log("one endpoint without node hints: zone hints apply")
	f.setEndpoints(t, svc, v4,
		f.ep("pod-a", v4, nodeHints(nodeName), inZone),
		f.ep("pod-b", v4, inZone),
		f.ep("pod-c", v4, nodeHints(otherNode), elsewhere))
	waitServes(t, tcpWho, f.clientNS, vip, "pod-a", "pod-b")
}

// testIgnored: a Service another proxy owns and a headless Service never
// reach the maps.
func testIgnored(t *testing.T, f *fixture, ns string) {
	// A target port no other scenario uses, so its backends are
	// recognisable in kpr dump.
	const otherPort = 9797
	port := kubeobj.Port{Name: "tcp", Port: 80, TargetPort: otherPort}

	foreign := kubeobj.Service(ns, "foreign", port)
	foreign.Labels = map[string]string{desired.LabelServiceProxyName: "some-other-proxy"}
	foreign = f.createService(t, foreign)
	f.setEndpoints(t, foreign, v4, f.eps("pod-a")...)

	headless := kubeobj.Service(ns, "headless", port)
	headless.Spec.ClusterIP = v1.ClusterIPNone
	headless = f.createService(t, headless)
	slice := kubeobj.Slice(headless, "headless-1", v4, f.eps("pod-b")...)
	slice.Labels[v1.IsHeadlessService] = ""
	f.applySlice(t, slice)
	// The same without the slice label: the Service itself is headless.
	f.applySlice(t, kubeobj.Slice(headless, "headless-2", v4, f.eps("pod-c")...))

	// Events are handled in order: once a Service created afterwards works,
	// kpr has seen (and skipped) the ones above.
	marker := f.createService(t, kubeobj.Service(ns, "marker", tcp80))
	f.setEndpoints(t, marker, v4, f.eps("pod-d")...)
	waitServes(t, tcpWho, f.clientNS, clusterIP(t, marker, v1.IPv4Protocol, 80), "pod-d")

	foreignVIP := clusterIP(t, foreign, v1.IPv4Protocol, 80)
	if f.hasFrontend(t, foreignVIP.Addr()) {
		t.Errorf("Service labelled %s is programmed", desired.LabelServiceProxyName)
	}
	switch {
	case f.mode.iptables():
		if save := f.iptablesSave(t, false); strings.Contains(save, fmt.Sprintf(":%d", otherPort)) {
			t.Errorf("the iptables tables have a backend of an ignored Service (port %d):\n%s", otherPort, save)
		}
	case f.mode.nftables:
		if list := f.nftList(t); strings.Contains(list, fmt.Sprintf(":%d", otherPort)) {
			t.Errorf("kpr's nftables table has a backend of an ignored Service (port %d):\n%s", otherPort, list)
		}
	case f.mode.ipvs:
		for k, vs := range f.virtualServers(t) {
			for b := range vs.Dests {
				if b.Port == otherPort {
					t.Errorf("IPVS virtual server %s has real server %s of an ignored Service", k, b)
				}
			}
		}
	default:
		for _, s := range f.dump(t) {
			for _, b := range s.Backends {
				if strings.HasSuffix(b, fmt.Sprintf(":%d", otherPort)) {
					t.Errorf("kpr dump has backend %s of an ignored Service (frontend %s)", b, s.Frontend)
				}
			}
		}
	}
	f.requireUntranslated(t, f.clientNS, foreignVIP)
}

// testUDP: UDP Services in both families; replies come from the ClusterIP
// and port, for unconnected and connected sockets.
func testUDP(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.DualStack(kubeobj.Service(ns, "dns",
		kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP})))
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	f.setEndpoints(t, svc, v6, f.ep("pod-a", v6), f.ep("pod-b", v6))
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		vip := clusterIP(t, svc, fam, 53)
		waitServes(t, udpWho, f.clientNS, vip, "pod-a", "pod-b")
		requireServes(t, udpWho, f.pod("pod-c").NetNS, vip, "pod-a", "pod-b")
		// A connected socket drops replies from any other source.
		if _, err := harness.WhoUDPConnected(f.clientNS, vip, dialTimeout); err != nil {
			t.Errorf("connected UDP socket to %s: %v", vip, err)
		}
	}
	// A backend going away is no longer chosen.
	f.setEndpoints(t, svc, v4, f.eps("pod-b")...)
	waitServes(t, udpWho, f.clientNS, clusterIP(t, svc, v1.IPv4Protocol, 53), "pod-b")
}

// testStaleUDPSocket: a connected UDP socket whose backend leaves the
// Service is destroyed by kpr (the application sees ECONNABORTED and
// reconnects), the counterpart of kube-proxy flushing stale UDP conntrack
// entries. The client namespace is held by a process in kpr's cgroup, as a
// pod's pause container holds the pod's.
func testStaleUDPSocket(t *testing.T, f *fixture, ns string) {
	if !loader.Probe().Has(loader.FeatureUDPSockTerm) {
		t.Skip("this kernel cannot destroy UDP sockets (iter/udp and bpf_sock_destroy need Linux 6.5+); `kpr probe` says so")
	}
	pause := exec.Command("sleep", "600")
	if err := harness.StartCommand(f.clientNS, pause); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pause.Process.Kill()
		_ = pause.Wait()
	})
	svc := f.createService(t, kubeobj.Service(ns, "dns",
		kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}))
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 53)
	waitServes(t, udpWho, f.clientNS, vip, "pod-a")

	c, err := harness.DialUDP(f.clientNS, vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if who, err := harness.AskUDP(c, dialTimeout); err != nil || who != "pod-a" {
		t.Fatalf("connected socket to %s: %q, %v; want pod-a", vip, who, err)
	}

	f.setEndpoints(t, svc, v4, f.eps("pod-b")...)
	// A destroyed socket reports ECONNABORTED to a pending or next receive;
	// it is disconnected too, so a send on it fails with EDESTADDRREQ.
	waitUntil(t, convergeTimeout, "the socket connected to the removed pod-a is destroyed", func() error {
		who, err := harness.AskUDP(c, 200*time.Millisecond)
		if errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EDESTADDRREQ) {
			return nil
		}
		return fmt.Errorf("the old socket still answers %q, %v", who, err)
	})
	waitServes(t, udpWho, f.clientNS, vip, "pod-b")
	// Operators see it, and how full the maps are.
	waitUntil(t, convergeTimeout, "kpr's metrics count the destroyed socket", func() error {
		for series, want := range map[string]func(v string) bool{
			"kpr_udp_sockets_destroyed_total":             func(v string) bool { return v != "0" },
			`kpr_bpf_map_entries{map="kpr_services"}`:     func(v string) bool { return v != "0" },
			`kpr_bpf_map_max_entries{map="kpr_services"}`: func(v string) bool { return v == "262144" },
		} {
			v, err := f.kpr.Metric(series)
			if err != nil {
				return err
			}
			if !want(v) {
				return fmt.Errorf("%s = %q", series, v)
			}
		}
		return nil
	})
}

// testDualStack: a dual-stack Service answers on both ClusterIPs, each
// with the backends of its own family.
func testDualStack(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.DualStack(kubeobj.Service(ns, "both", tcp80)))
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("dual-stack Service got ClusterIPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	f.setEndpoints(t, svc, v6, f.ep("pod-b", v6), f.ep("pod-c", v6))
	vip4, vip6 := clusterIP(t, svc, v1.IPv4Protocol, 80), clusterIP(t, svc, v1.IPv6Protocol, 80)
	waitServes(t, tcpWho, f.clientNS, vip4, "pod-a", "pod-b")
	waitServes(t, tcpWho, f.clientNS, vip6, "pod-b", "pod-c")
	requireServes(t, tcpWho, f.pod("pod-d").NetNS, vip6, "pod-b", "pod-c")

	if f.mode.iptables() || f.mode.nftables {
		return // each family has rules and maps of its own: no backend can be of the other
	}
	if f.mode.ipvs {
		// IPVS can forward to a real server of the other family (a
		// tunnel), so its virtual servers are checked as the maps are.
		for _, vip := range []netip.AddrPort{vip4, vip6} {
			key := ipvs.ServiceKey{IPv6: vip.Addr().Is6(), Addr: vip.Addr(), Proto: dataplane.TCP, Port: vip.Port()}
			vs := f.virtualServers(t)[key]
			if vs == nil {
				t.Fatalf("no IPVS virtual server %s", key)
			}
			for b := range vs.Dests {
				if b.Addr.Unmap().Is4() != vip.Addr().Is4() {
					t.Errorf("IPVS virtual server %s has real server %s of the other family", key, b)
				}
			}
		}
		return
	}
	for _, s := range append(frontendsOf(f.dump(t), vip4.Addr()), frontendsOf(f.dump(t), vip6.Addr())...) {
		for _, b := range s.Backends {
			ap := netip.MustParseAddrPort(b)
			fe := netip.MustParseAddrPort(s.Frontend)
			if ap.Addr().Is4() != fe.Addr().Is4() {
				t.Errorf("frontend %s has backend %s of the other family", s.Frontend, b)
			}
		}
	}
}

// testNodePort: the node's own sockets reach a NodePort on the node IP and
// on 127.0.0.1; pods reach it on the node IP, while 127.0.0.1 in a pod is
// the pod's own loopback.
func testNodePort(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "np", tcp80)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc = f.createService(t, svc)
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	if nodePort == 0 {
		t.Fatalf("NodePort Service got no nodePort: %+v", svc.Spec.Ports)
	}
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	onNodeIP := netip.AddrPortFrom(nodeIP.Addr(), nodePort)
	onLoopback := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), nodePort)
	waitServes(t, tcpWho, f.clientNS, onNodeIP, "pod-a", "pod-b")
	if f.mode.ipvs || f.mode.nftables {
		// IPVS does not forward packets from lo to other hosts, so the
		// IPVS mode, as kube-proxy's, has no NodePort on 127.0.0.1
		// (iptables-compat/ipvs, servable), nor has the nftables mode, as
		// kube-proxy's nftables mode has none: nothing listens there.
		if err := dialErr(f.node.NetNS, onLoopback, false); !refused(err) {
			t.Errorf("connect to %s from the node under the %s mode: %v, want ECONNREFUSED (no NodePort on loopback)", onLoopback, f.mode.name, err)
		}
	} else {
		requireServes(t, tcpWho, f.node.NetNS, onLoopback, "pod-a", "pod-b")
	}
	requireServes(t, tcpWho, f.pod("pod-c").NetNS, onNodeIP, "pod-a", "pod-b")
	requireServes(t, tcpWho, f.clientNS, clusterIP(t, svc, v1.IPv4Protocol, 80), "pod-a", "pod-b")

	own, err := f.pod("pod-c").ServeTCP(nodePort)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Stop()
	requireServes(t, tcpWho, f.pod("pod-c").NetNS, onLoopback, "pod-c")
}
