package e2e

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/nftables"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/harness"
)

// dataMode is one dataplane the scenarios run against: the same
// scenarios, the same assertions, whatever programs the kernel.
type dataMode struct {
	name string
	// args are the `kpr run` flags that select it.
	args []string
	// variant is the iptables variant the node uses ("nft", "legacy"):
	// the iptables mode's rules are in it, and so are the IPVS mode's
	// masquerade and source-range rules. Empty for the eBPF mode.
	variant string
	// ipvs says kpr serves Services through IPVS virtual servers, with
	// iptables only around them.
	ipvs bool
	// nftables says kpr serves Services through its nftables table
	// (inet kpr); variant is then only the node's other rules'.
	nftables bool
	// packetPath runs the eBPF mode with --socket-lb per-pod and the
	// scenarios' client (fixture.client) a bypassed pod, served by the
	// packet path on its veth rather than by the socket hooks.
	packetPath bool
}

// The modes. The eBPF one runs under the default --mode auto, which
// picks it on a kernel that has the hooks (available checks that).
var (
	modeEBPF           = dataMode{name: "ebpf"}
	modeIPTablesNFT    = dataMode{name: "iptables-nft", args: []string{"--mode", "iptables"}, variant: "nft"}
	modeIPTablesLegacy = dataMode{name: "iptables-legacy", args: []string{"--mode", "iptables"}, variant: "legacy"}
	modeIPVS           = dataMode{name: "ipvs", args: []string{"--mode", "ipvs"}, variant: "nft", ipvs: true}
	modeNFTables       = dataMode{name: "nftables", args: []string{"--mode", "nftables"}, variant: "nft", nftables: true}
	modePacketPath     = dataMode{name: "ebpf-packet-path", args: []string{"--socket-lb", "per-pod"}, packetPath: true}
	allModes           = []dataMode{modeEBPF, modePacketPath, modeIPTablesNFT, modeIPTablesLegacy, modeIPVS, modeNFTables}
)

// ebpf says kpr translates in its BPF programs, with no netfilter rule.
func (m dataMode) ebpf() bool { return m.variant == "" }

// iptables says kpr serves Services through iptables DNAT rules.
func (m dataMode) iptables() bool { return m.variant != "" && !m.ipvs && !m.nftables }

// available says why this machine cannot run m, "" if it can.
func (m dataMode) unavailable() string {
	if m.ebpf() {
		if err := loader.Probe().RequireSocketLB(); err != nil {
			return "the kernel cannot run the eBPF mode: " + err.Error()
		}
		if m.packetPath && !loader.Probe().Has(loader.FeatureNetnsCookieSockopt) {
			return "the kernel lacks SO_NETNS_COOKIE (Linux 5.14+): --socket-lb per-pod serves every pod with the socket hooks, and loads no packet path"
		}
		return ""
	}
	for _, bin := range []string{m.tool("iptables", "restore"), m.tool("iptables", "save"), m.tool("ip6tables", "restore")} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s is not installed: %v", bin, err)
		}
	}
	if m.nftables {
		if err := nftables.Available(""); err != nil {
			return "the nftables mode cannot run on this machine: " + err.Error()
		}
	}
	if m.ipvs {
		// kpr programs IPVS and the ipsets through netlink: ipvsadm and
		// ipset need not be installed, the kernel's modules must be.
		if err := netfilter.IPVSAvailable(""); err != nil {
			return "the IPVS mode cannot run on this kernel (it runs in the kernel-matrix VM: make test-kernels-e2e): " + err.Error()
		}
		if err := dummyLinks(); err != nil {
			return "the IPVS mode cannot run on this kernel (it runs in the kernel-matrix VM: make test-kernels-e2e): " +
				"it binds the virtual addresses to a dummy interface, and creating one fails: " + err.Error()
		}
	}
	return ""
}

// dummyLinks says whether the kernel can create dummy links, trying in a
// network namespace of its own that dies with its thread: the host's
// interfaces are never touched.
func dummyLinks() error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, in the new namespace, exits with
		// the goroutine and takes the namespace and its link along.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare a network namespace: %w", err)
			return
		}
		if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kpr-probe0"}}); err != nil {
			errc <- fmt.Errorf("ip link add kpr-probe0 type dummy: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// tool is a binary of m's variant, e.g. iptables-nft-save.
func (m dataMode) tool(base, op string) string { return base + "-" + m.variant + "-" + op }

// forEachMode runs fn against every mode this machine can run, each as a
// subtest named after it; a mode it cannot run is skipped, saying why.
func forEachMode(t *testing.T, modes []dataMode, fn func(t *testing.T, m dataMode)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			harness.RequireRoot(t)
			if why := m.unavailable(); why != "" {
				t.Skip(why)
			}
			fn(t, m)
		})
	}
}

// prepareNode makes the node namespace what the mode needs before kpr
// starts. For iptables and IPVS (whose masquerade and source-range rules
// are iptables too): a rule in the variant's tables, so that kpr's
// detection (the variant holding more rules, as kube-proxy's) picks it;
// and routes to the Service ranges, since a node socket's connect looks
// up a route before nat OUTPUT rewrites the destination (a real node has
// its default route; here untranslated Service addresses still fail; the
// IPVS mode's addresses are local, on kpr-ipvs0, and win over the route).
func (f *fixture) prepareNode(m dataMode) {
	f.t.Helper()
	if m.ebpf() {
		return
	}
	// The rule is also a conntrack user other than kpr, as a real node
	// has (kubelet's and the CNI plugin's rules): the kernel enables
	// conntrack in a namespace only while some rule needs it, so without
	// one, removing kpr's last rule would end the NAT of the connections
	// its rules translated.
	seed := "*filter\n:KPR-E2E-VARIANT - [0:0]\n-A KPR-E2E-VARIANT -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n"
	if _, err := f.inNode(m.tool("iptables", "restore"), []byte(seed), "--noflush"); err != nil {
		f.t.Fatal(err)
	}
	for _, r := range strings.Split(cluster.DefaultServiceClusterIPRange, ",") {
		dst := netip.MustParsePrefix(r)
		ipnet := &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}
		route := &netlink.Route{Dst: ipnet, LinkIndex: f.node.BridgeIndex}
		if err := f.node.NetNS.Netlink().RouteAdd(route); err != nil {
			f.t.Fatalf("route %s in the node namespace: %v", dst, err)
		}
	}
}

// inNode runs a command inside the node namespace and returns its output.
func (f *fixture) inNode(bin string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errOut
	if err := harness.StartCommand(f.node.NetNS, cmd); err != nil {
		return nil, err
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("%s %v in %s: %w: %s", bin, args, f.node.NetNS.Name, err, errOut.String())
	}
	return out.Bytes(), nil
}

// nftList is kpr's nftables table in the node, as nft lists it.
func (f *fixture) nftList(t *testing.T) string {
	t.Helper()
	out, err := f.inNode("nft", nil, "list", "table", string(nftables.Family), nftables.TableName)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// iptablesSave is the node's nat and filter tables of one family.
func (f *fixture) iptablesSave(t *testing.T, v6 bool) string {
	t.Helper()
	base := "iptables"
	if v6 {
		base = "ip6tables"
	}
	out, err := f.inNode(f.mode.tool(base, "save"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// hasFrontend says whether kpr programs a frontend on addr: in the eBPF
// maps (kpr dump), in the IPVS virtual servers or in the iptables Service
// chains.
func (f *fixture) hasFrontend(t *testing.T, addr netip.Addr) bool {
	t.Helper()
	switch {
	case f.mode.ebpf():
		return len(frontendsOf(f.dump(t), addr)) > 0
	case f.mode.ipvs:
		for k := range f.virtualServers(t) {
			if k.Addr == addr.Unmap() {
				return true
			}
		}
		return false
	case f.mode.nftables:
		// A frontend is an element of a verdict map: "addr . tcp . 80 : ...".
		return strings.Contains(f.nftList(t), " "+addr.Unmap().String()+" . ")
	}
	bits := 32
	if !addr.Unmap().Is4() {
		bits = 128
	}
	match := fmt.Sprintf(" -d %s/%d ", addr.Unmap(), bits)
	for _, l := range strings.Split(f.iptablesSave(t, bits == 128), "\n") {
		if (strings.HasPrefix(l, "-A KUBE-SERVICES ") || strings.HasPrefix(l, "-A KUBE-NODEPORTS ")) && strings.Contains(l, match) {
			return true
		}
	}
	return false
}

// virtualServers are the node's IPVS virtual servers and their real
// servers, as the kernel has them.
func (f *fixture) virtualServers(t *testing.T) map[ipvs.ServiceKey]*ipvs.ServiceState {
	t.Helper()
	k, err := ipvs.NewNetlinkKernel(f.node.NetNS.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	svcs, err := k.Services()
	if err != nil {
		t.Fatalf("list the IPVS virtual servers of %s: %v", f.node.NetNS.Name, err)
	}
	return svcs
}
