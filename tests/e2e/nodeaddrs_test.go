package e2e

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// tcp8080 is a Service port on the pods' TCP echo port itself, so that an
// address that is not translated still finds a listener: a pod's own.
var tcp8080 = kubeobj.Port{Name: "tcp", Port: int32(tcpPort), TargetPort: int32(tcpPort)}

// TestNodeAddressFlags runs kpr with the restrictive address settings:
// NodePorts on the Node's primary IP only, ExternalIPs only where they are
// this node's.
func TestNodeAddressFlags(t *testing.T) {
	f := newFixture(t, "--nodeport-addresses", "primary", "--external-ips", "node-local")
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, f *fixture, ns string)
	}{
		{"nodeport-primary", testNodePortPrimary},
		{"external-ip-node-local", testExternalIPNodeLocal},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sc.run(t, f, f.namespace(t, sc.name))
			f.requireRunning(t)
		})
	}
}

// testNodePortPrimary: with "primary" the NodePort is served on the node IP
// and not on loopback, not even to the host's own sockets.
func testNodePortPrimary(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "np", tcp80)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc = f.createService(t, svc)
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.node.NetNS, netip.AddrPortFrom(nodeIP.Addr(), nodePort), "pod-a", "pod-b")
	for _, lo := range []string{"127.0.0.1", "::1"} {
		if fe := frontendsOf(f.dump(t), netip.MustParseAddr(lo)); len(fe) != 0 {
			t.Errorf("--nodeport-addresses primary, yet kpr serves %+v", fe)
		}
		// Nothing listens there in the node namespace.
		if who, err := tcpWho(f.node.NetNS, netip.AddrPortFrom(netip.MustParseAddr(lo), nodePort)); err == nil {
			t.Errorf("connect to %s:%d from the host netns reached %s, want no NodePort on loopback", lo, nodePort, who)
		}
	}
}

// testExternalIPNodeLocal: CVE-2020-8554. A Service claims pod-d's address
// as an ExternalIP; under node-local the node's sockets still reach pod-d
// itself, while an ExternalIP that is the node's own address is served.
func testExternalIPNodeLocal(t *testing.T, f *fixture, ns string) {
	foreign := f.pod("pod-d").IPv4
	svc := kubeobj.Service(ns, "intruder", tcp8080)
	svc.Spec.ExternalIPs = []string{foreign.String(), nodeIP.Addr().String()}
	svc = f.createService(t, svc)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.node.NetNS, netip.AddrPortFrom(nodeIP.Addr(), tcpPort), "pod-a", "pod-b")
	requireServes(t, tcpWho, f.node.NetNS, netip.AddrPortFrom(foreign, tcpPort), "pod-d")
	requireServes(t, tcpWho, f.pod("pod-c").NetNS, netip.AddrPortFrom(foreign, tcpPort), "pod-d")
	if fe := frontendsOf(f.dump(t), foreign); len(fe) != 0 {
		t.Errorf("--external-ips node-local, yet kpr programs the foreign ExternalIP: %+v", fe)
	}
}

// testExternalIPAll is kube-proxy's behaviour, kpr's default: an ExternalIP
// captures the node's connections to that address, whoever owns it.
func testExternalIPAll(t *testing.T, f *fixture, ns string) {
	foreign := f.pod("pod-d").IPv4
	svc := kubeobj.Service(ns, "intruder", tcp8080)
	svc.Spec.ExternalIPs = []string{foreign.String()}
	svc = f.createService(t, svc)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.node.NetNS, netip.AddrPortFrom(foreign, tcpPort), "pod-a", "pod-b")
	// Delete it, or later scenarios of the group lose pod-d's address.
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServes(t, tcpWho, f.node.NetNS, netip.AddrPortFrom(foreign, tcpPort), "pod-d")
}
