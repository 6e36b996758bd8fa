package iptables

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the renderer's output")

// The hash of a chain name is kube-proxy's: these are the chains every
// kubeadm cluster's kube-proxy writes for its API server and DNS Services.
func TestChainNamesAreKubeProxys(t *testing.T) {
	for _, tc := range []struct {
		name dataplane.ServicePortName
		want string
	}{
		{dataplane.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https", Protocol: dataplane.TCP}, "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{dataplane.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns", Protocol: dataplane.UDP}, "KUBE-SVC-TCOU7JCQXEZGVUNU"},
		{dataplane.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp", Protocol: dataplane.TCP}, "KUBE-SVC-ERIFXISQEP7F7OF4"},
		{dataplane.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "metrics", Protocol: dataplane.TCP}, "KUBE-SVC-JD5MR3NA4I4DYORP"},
	} {
		if got := clusterChain(tc.name); got != tc.want {
			t.Errorf("clusterChain(%s) = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func be(s string) dataplane.Backend {
	ap := netip.MustParseAddrPort(s)
	return dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}
}

func bes(s ...string) []dataplane.Backend {
	out := []dataplane.Backend{}
	for _, x := range s {
		out = append(out, be(x))
	}
	return out
}

func front(kind dataplane.FrontendKind, addrPort string, proto dataplane.Protocol, backends, external []dataplane.Backend) dataplane.Frontend {
	ap := netip.MustParseAddrPort(addrPort)
	return dataplane.Frontend{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto, Kind: kind, Backends: backends, ExternalBackends: external}
}

func spn(ns, name, port string, proto dataplane.Protocol) dataplane.ServicePortName {
	return dataplane.ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: proto}
}

// goldenCases are representative Services, one golden file each.
func goldenCases() map[string][]*dataplane.ServicePort {
	dns := spn("kube-system", "kube-dns", "dns", dataplane.UDP)
	web := spn("shop", "web", "http", dataplane.TCP)
	lb := spn("shop", "front", "", dataplane.TCP)
	empty := spn("shop", "empty", "", dataplane.TCP)
	sticky := spn("shop", "cart", "", dataplane.TCP)
	dual := spn("shop", "dual", "", dataplane.TCP)
	fenced := spn("shop", "fenced", "https", dataplane.TCP)
	return map[string][]*dataplane.ServicePort{
		"clusterip-udp": {{Name: dns, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, bes("10.244.0.10:53", "10.244.1.10:53"), nil)}}},
		"nodeport-cluster-policy": {{Name: web, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.20:80", dataplane.TCP, bes("10.244.0.5:8080", "10.244.1.5:8080", "10.244.2.5:8080"), nil),
			front(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, bes("10.244.0.5:8080", "10.244.1.5:8080", "10.244.2.5:8080"), nil),
			front(dataplane.ExternalIP, "203.0.113.10:80", dataplane.TCP, bes("10.244.0.5:8080", "10.244.1.5:8080", "10.244.2.5:8080"), nil)}}},
		"loadbalancer-local-policy": {{Name: lb, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.30:443", dataplane.TCP, bes("10.244.0.7:8443", "10.244.1.7:8443"), nil),
			front(dataplane.NodePort, "192.168.1.10:31443", dataplane.TCP, bes("10.244.0.7:8443", "10.244.1.7:8443"), bes("10.244.0.7:8443")),
			front(dataplane.LoadBalancer, "198.51.100.30:443", dataplane.TCP, bes("10.244.0.7:8443", "10.244.1.7:8443"), bes("10.244.0.7:8443"))}}},
		"local-policy-no-local-endpoints": {{Name: lb, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.30:443", dataplane.TCP, bes("10.244.1.7:8443"), nil),
			front(dataplane.NodePort, "192.168.1.10:31443", dataplane.TCP, bes("10.244.1.7:8443"), bes())}}},
		"no-endpoints": {{Name: empty, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.40:80", dataplane.TCP, bes(), nil),
			front(dataplane.NodePort, "192.168.1.10:30040", dataplane.TCP, bes(), nil),
			front(dataplane.ExternalIP, "203.0.113.40:80", dataplane.TCP, bes(), nil)}}},
		"session-affinity": {{Name: sticky, AffinityTimeout: 3 * time.Hour, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.50:80", dataplane.TCP, bes("10.244.0.8:80", "10.244.1.8:80"), nil)}}},
		// Ranges of IPv4 only: the IPv6 load-balancer IP stays open, as
		// under kube-proxy's IPv6 proxier; 198.51.100.50/32 is the VIP the
		// desired state adds when the ranges hold the node IP.
		"loadbalancer-source-ranges": {{Name: fenced,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("198.51.100.50/32")},
			Frontends: []dataplane.Frontend{
				front(dataplane.ClusterIP, "10.96.0.70:443", dataplane.TCP, bes("10.244.0.11:8443"), nil),
				front(dataplane.NodePort, "192.168.1.10:31444", dataplane.TCP, bes("10.244.0.11:8443"), nil),
				front(dataplane.LoadBalancer, "198.51.100.50:443", dataplane.TCP, bes("10.244.0.11:8443"), nil),
				front(dataplane.ClusterIP, "[fd00:10:96::70]:443", dataplane.TCP, bes("[fd00:10:244::11]:8443"), nil),
				front(dataplane.LoadBalancer, "[2001:db8:51::50]:443", dataplane.TCP, bes("[fd00:10:244::11]:8443"), nil)}}},
		"dual-stack": {{Name: dual, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.60:80", dataplane.TCP, bes("10.244.0.9:80"), nil),
			front(dataplane.ClusterIP, "[fd00:10:96::60]:80", dataplane.TCP, bes("[fd00:10:244::9]:80", "[fd00:10:244:1::9]:80"), nil)}}},
	}
}

// fullSyncInput is what a full sync of sps writes into tables that hold
// nothing yet, per family and table.
func fullSyncInput(sps []*dataplane.ServicePort, cfg config) []byte {
	var out bytes.Buffer
	rendered := map[dataplane.ServicePortName]*renderedPort{}
	var names []dataplane.ServicePortName
	for _, sp := range sps {
		rendered[sp.Name] = render(sp, []netfilter.Family{netfilter.IPv4, netfilter.IPv6}, cfg)
		names = append(names, sp.Name)
	}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		for _, table := range tables {
			in := tableInputOf(fam, table, cfg, rendered, nil, names, true)
			in.jumps = netfilter.MissingJumps(table, baseJumpsOf(fam, cfg), nil)
			out.WriteString("# " + fam.String() + "\n")
			out.Write(in.render())
		}
	}
	return out.Bytes()
}

// masqueradeCases render a Cluster and a Local internal policy Service, a
// NodePort and a dual-stack one under kube-proxy's --masquerade-all and
// --cluster-cidr, one golden file each.
func masqueradeCases() map[string]netfilter.Masquerade {
	return map[string]netfilter.Masquerade{
		"masquerade-all": {All: true},
		"cluster-cidr":   {Local: netfilter.LocalTraffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}}},
		// --detect-local-mode BridgeInterface and InterfaceNamePrefix.
		"bridge-interface":      {Local: netfilter.LocalTraffic{Bridge: "cbr0"}},
		"interface-name-prefix": {Local: netfilter.LocalTraffic{InterfacePrefix: "veth"}},
	}
}

func masqueradeServices() []*dataplane.ServicePort {
	cases := goldenCases()
	internalLocal := spn("shop", "node-local", "", dataplane.TCP)
	return append(slices.Concat(cases["nodeport-cluster-policy"], cases["dual-stack"], cases["loadbalancer-local-policy"]),
		&dataplane.ServicePort{Name: internalLocal, Frontends: []dataplane.Frontend{
			// internalTrafficPolicy: Local: the ClusterIP's own set is the
			// node's endpoints, and its chain KUBE-SVL-*.
			front(dataplane.ClusterIP, "10.96.0.80:80", dataplane.TCP, bes("10.244.0.12:80"), nil),
			front(dataplane.NodePort, "192.168.1.10:30081", dataplane.TCP, bes("10.244.0.12:80", "10.244.1.12:80"), nil)}})
}

// protectionCases render a NodePort on the node's address and on
// 127.0.0.1 with localhost NodePorts served and not, and with
// nf_conntrack_tcp_be_liberal set, one golden file each.
func protectionCases() map[string]config {
	return map[string]config{
		"localhost-nodeports":    {localhostNodePorts: true},
		"no-localhost-nodeports": {},
		"tcp-be-liberal":         {localhostNodePorts: true, tcpLiberal: true},
	}
}

func localhostServices() []*dataplane.ServicePort {
	web := spn("shop", "web", "", dataplane.TCP)
	pods := bes("10.244.0.5:8080", "[fd00:10:244::5]:8080")
	return []*dataplane.ServicePort{{Name: web, Frontends: []dataplane.Frontend{
		front(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, pods, nil),
		front(dataplane.NodePort, "127.0.0.1:30080", dataplane.TCP, pods, nil),
		front(dataplane.NodePort, "[::1]:30080", dataplane.TCP, pods, nil),
		front(dataplane.NodePort, "[fd00::10]:30080", dataplane.TCP, pods, nil)}}}
}

func TestRenderGolden(t *testing.T) {
	inputs := map[string]func() []byte{}
	for name, sps := range goldenCases() {
		inputs[name] = func() []byte { return fullSyncInput(sps, config{}) }
	}
	for name, masq := range masqueradeCases() {
		inputs[name] = func() []byte { return fullSyncInput(masqueradeServices(), config{masq: masq}) }
	}
	for name, cfg := range protectionCases() {
		inputs[name] = func() []byte { return fullSyncInput(localhostServices(), cfg) }
	}
	for name, input := range inputs {
		t.Run(name, func(t *testing.T) {
			got := input()
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestRenderGolden -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("rendering differs from %s (if the change is intended, rerun with -update and review the diff):\n%s",
					path, lineDiff(string(want), string(got)))
			}
		})
	}
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if g[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if w[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
