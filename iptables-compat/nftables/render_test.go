package nftables

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the Plane's output")

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

func changes(sps ...*dataplane.ServicePort) map[dataplane.ServicePortName]*dataplane.ServicePort {
	out := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for _, sp := range sps {
		out[sp.Name] = sp
	}
	return out
}

var bothFamilies = []netfilter.Family{netfilter.IPv4, netfilter.IPv6}

// goldenCases are representative Services, one golden file each: the
// same as the iptables backend's, so the two renderings can be compared.
// manyBackends is n endpoints on port 8080.
func manyBackends(n int) []dataplane.Backend {
	out := make([]dataplane.Backend, n)
	for i := range out {
		out[i] = dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(1 + i%250)}), Port: 8080}
	}
	return out
}

func goldenCases() map[string][]*dataplane.ServicePort {
	dns := spn("kube-system", "kube-dns", "dns", dataplane.UDP)
	web := spn("shop", "web", "http", dataplane.TCP)
	lb := spn("shop", "front", "", dataplane.TCP)
	empty := spn("shop", "empty", "", dataplane.TCP)
	sticky := spn("shop", "cart", "", dataplane.TCP)
	dual := spn("shop", "dual", "", dataplane.TCP)
	fenced := spn("shop", "fenced", "https", dataplane.TCP)
	pods := bes("10.244.0.5:8080", "[fd00:10:244::5]:8080")
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
		"loadbalancer-source-ranges": {{Name: fenced,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("198.51.100.50/32")},
			Frontends: []dataplane.Frontend{
				front(dataplane.ClusterIP, "10.96.0.70:443", dataplane.TCP, bes("10.244.0.11:8443"), nil),
				front(dataplane.NodePort, "192.168.1.10:31444", dataplane.TCP, bes("10.244.0.11:8443"), nil),
				front(dataplane.LoadBalancer, "198.51.100.50:443", dataplane.TCP, bes("10.244.0.11:8443"), nil),
				front(dataplane.ClusterIP, "[fd00:10:96::70]:443", dataplane.TCP, bes("[fd00:10:244::11]:8443"), nil),
				front(dataplane.LoadBalancer, "[2001:db8:51::50]:443", dataplane.TCP, bes("[fd00:10:244::11]:8443"), nil)}}},
		// From vmapFromEndpoints endpoints on, one rule picks through a
		// verdict map.
		"many-endpoints": {{Name: spn("shop", "many", "", dataplane.TCP), Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.80:80", dataplane.TCP, manyBackends(vmapFromEndpoints), nil)}}},
		"dual-stack": {{Name: dual, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.60:80", dataplane.TCP, bes("10.244.0.9:80"), nil),
			front(dataplane.ClusterIP, "[fd00:10:96::60]:80", dataplane.TCP, bes("[fd00:10:244::9]:80", "[fd00:10:244:1::9]:80"), nil)}}},
		// NodePorts on loopback are not served, as in kube-proxy's
		// nftables mode: only those on the node's addresses are.
		"localhost-nodeports": {{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
			front(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, pods, nil),
			front(dataplane.NodePort, "127.0.0.1:30080", dataplane.TCP, pods, nil),
			front(dataplane.NodePort, "[::1]:30080", dataplane.TCP, pods, nil),
			front(dataplane.NodePort, "[fd00::10]:30080", dataplane.TCP, pods, nil)}}},
	}
}

// masqueradeCases render under kube-proxy's --masquerade-all and
// --cluster-cidr.
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
	return slices.Concat(cases["nodeport-cluster-policy"], cases["dual-stack"], cases["loadbalancer-local-policy"])
}

// fullSync is the table a Reconcile of sps writes into an empty one, as
// nft would list it.
func fullSync(t *testing.T, sps []*dataplane.ServicePort, masq netfilter.Masquerade) string {
	t.Helper()
	fake := knftables.NewFake(Family, TableName)
	p, err := New(Options{NFT: fake, Families: bothFamilies, Masquerade: masq})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(changes(sps...)); err != nil {
		t.Fatal(err)
	}
	return fake.Dump()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("the table differs from %s (if the change is intended, rerun with -update and review the diff):\n%s",
			path, lineDiff(string(want), got))
	}
}

// The whole table a full sync writes, for each case.
func TestRenderGolden(t *testing.T) {
	for name, sps := range goldenCases() {
		t.Run(name, func(t *testing.T) { checkGolden(t, name, fullSync(t, sps, netfilter.Masquerade{})) })
	}
	for name, masq := range masqueradeCases() {
		t.Run(name, func(t *testing.T) { checkGolden(t, name, fullSync(t, masqueradeServices(), masq)) })
	}
}

// A partial sync writes only what changed: an endpoint added to one of
// two Services rewrites that Service's chain and adds its endpoint chain,
// in one transaction, and touches neither the shared chains nor the
// other Service.
func TestPartialSyncGolden(t *testing.T) {
	cases := goldenCases()
	web := cases["nodeport-cluster-policy"][0]
	dns := cases["clusterip-udp"][0]
	fake := knftables.NewFake(Family, TableName)
	p, err := New(Options{NFT: fake, Families: bothFamilies})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(changes(web, dns)); err != nil {
		t.Fatal(err)
	}
	grown := *dns
	grown.Frontends = []dataplane.Frontend{front(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, bes("10.244.0.10:53", "10.244.1.10:53", "10.244.2.10:53"), nil)}
	gone := *web
	gone.Frontends = []dataplane.Frontend{front(dataplane.ClusterIP, "10.96.0.20:80", dataplane.TCP, bes(), nil)}
	var txs []string
	for _, c := range []map[dataplane.ServicePortName]*dataplane.ServicePort{
		changes(&grown),
		changes(&gone),
		{web.Name: nil},
	} {
		if err := p.Apply(c); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, fake.LastTransaction.String())
	}
	checkGolden(t, "partial-sync", strings.Join(txs, "# next transaction\n"))
	after := fake.Dump()
	if err := p.Reconcile(changes(&grown)); err != nil {
		t.Fatal(err)
	}
	if fake.Dump() != after {
		t.Errorf("the partial syncs left a table a full sync changes:\n%s", lineDiff(after, fake.Dump()))
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
