// Package kubeproxy removes what upstream kube-proxy leaves on a node, in
// each of its modes, so that a node moved to kpr's eBPF mode carries no
// second set of Service rules: the iptables mode's chains, the nftables
// mode's tables, and the IPVS mode's virtual servers, dummy interface,
// chains and ipsets. It is `kpr cleanup --kube-proxy`.
//
// The chains are picked by name, as kube-proxy's own `--cleanup` picks
// them. kpr's iptables mode writes the same names on purpose (a node
// moving between the two has one set of chains), so this also removes
// kpr's iptables-mode chains: that is what a move to the eBPF mode wants,
// and an iptables-mode kpr rewrites them on its next sync. Chains that
// kube-proxy creates only as a copy of the kubelet's (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) are the kubelet's to manage and
// stay, as under `kube-proxy --cleanup`.
package kubeproxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Node is the node network namespace to clean.
type Node struct {
	// Runner runs iptables-save/-restore and nft in the namespace.
	Runner netfilter.Runner
	// Do runs fn on a thread in the namespace, for the netlink calls.
	Do func(fn func() error) error
}

// Report is what Cleanup removed.
type Report struct {
	// Chains is how many iptables chains went, over both variants and
	// families.
	Chains int
	// NFTTables are the nftables tables deleted ("ip kube-proxy"); for
	// each, the family got a KeepNATTable.
	NFTTables []string
	// IPVSFlushed says the IPVS virtual servers were flushed; IPVSNote
	// says why not when the node shows no IPVS-mode kube-proxy.
	IPVSFlushed bool
	IPVSNote    string
	// DummyRemoved says the kube-ipvs0 interface was deleted.
	DummyRemoved bool
	// IPSets are the ipsets destroyed.
	IPSets []string
}

// dummyDevice is the interface the IPVS mode binds every Service address
// to.
const dummyDevice = "kube-ipvs0"

// Cleanup removes every kube-proxy leftover it finds in the namespace. The
// order matters: the IPVS virtual servers before the dummy interface that
// is the evidence of an IPVS-mode kube-proxy (so a cleanup that failed
// half-way still finds them), and the ipsets after the iptables rules that
// reference them (the kernel refuses to destroy a set in use). Every step
// runs even if an earlier one failed; the errors are joined.
//
// It removes no conntrack entry: connections kube-proxy NATed go on
// through them, and it keeps the nat hooks they need (keepnat.go, and
// docs/migration.md).
func Cleanup(n Node) (Report, error) {
	var rep Report
	var errs []error
	if err := n.Do(func() error { return removeIPVS(&rep) }); err != nil {
		errs = append(errs, err)
	}
	chains, err := netfilter.RemoveChains(n.Runner, []string{"nat", "filter", "mangle"}, isKubeProxyChain)
	rep.Chains = chains
	if err != nil {
		errs = append(errs, fmt.Errorf("remove kube-proxy's iptables chains: %w", err))
	}
	tables, err := removeNFTables(n.Runner)
	rep.NFTTables = tables
	if err != nil {
		errs = append(errs, err)
	}
	if err := n.Do(func() error { return removeIPSets(&rep) }); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// kube-proxy's fixed chains per table, from its iptables and IPVS
// proxiers (pkg/proxy/iptables and pkg/proxy/ipvs, CleanupLeftovers).
var kubeProxyChains = map[string][]string{
	"nat": {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY",
		"KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL",
		"KUBE-PROXY-CANARY", "KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
	"mangle": {"KUBE-PROXY-CANARY"},
}

// serviceChainPrefixes are the per-ServicePort and per-endpoint chains of
// the iptables mode.
var serviceChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-"}

func isKubeProxyChain(table, chain string) bool {
	if slices.Contains(kubeProxyChains[table], chain) {
		return true
	}
	if table != "nat" {
		return false
	}
	for _, p := range serviceChainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// nftTable is the nftables mode's table; it writes one per family.
const nftTable = "kube-proxy"

// removeNFTables deletes the nftables mode's tables. Without an nft binary
// there are none: kube-proxy's nftables mode runs nft itself.
func removeNFTables(r netfilter.Runner) ([]string, error) {
	families, err := familiesWithTable(r, nftTable)
	if err != nil || len(families) == 0 {
		return nil, err
	}
	var deleted []string
	var errs []error
	for _, family := range families {
		// Before the table goes: see keepnat.go.
		if err := keepNAT(r, family); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := r.Run("nft", []string{"delete", "table", family, nftTable}, nil); err != nil {
			errs = append(errs, fmt.Errorf("delete the nftables table %s %s: %w", family, nftTable, err))
			continue
		}
		deleted = append(deleted, family+" "+nftTable)
	}
	return deleted, errors.Join(errs...)
}

// removeIPVS flushes the IPVS virtual servers and deletes kube-ipvs0, if
// the namespace has that interface: an IPVS-mode kube-proxy always creates
// it, and IPVS state without it is not kube-proxy's to remove. Flushing
// all virtual servers is what `kube-proxy --cleanup` does too. It runs on a
// thread in the node's namespace.
func removeIPVS(rep *Report) error {
	link, err := netlink.LinkByName(dummyDevice)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			rep.IPVSNote = "no " + dummyDevice + " interface: no IPVS-mode kube-proxy ran here"
			return nil
		}
		return fmt.Errorf("look for kube-proxy's %s interface: %w", dummyDevice, err)
	}
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		// The interface is there but the kernel has no IPVS (any more):
		// there are no virtual servers to flush.
		rep.IPVSNote = "the kernel has no IPVS: " + err.Error()
	} else {
		if err := flushIPVS(); err != nil {
			return fmt.Errorf("flush the IPVS virtual servers: %w (kube-ipvs0 stays, so the next cleanup tries again)", err)
		}
		rep.IPVSFlushed = true
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("delete kube-proxy's %s interface: %w", dummyDevice, err)
	}
	rep.DummyRemoved = true
	return nil
}

// flushIPVS deletes every virtual server of the calling thread's network
// namespace. It runs only where the kernel has IPVS already.
func flushIPVS() error {
	h, err := mobyipvs.New("")
	if err != nil {
		return fmt.Errorf("open an IPVS netlink socket: %w", err)
	}
	defer h.Close()
	return h.Flush()
}

// ipSets are the IPVS mode's ipsets (pkg/proxy/ipvs/ipset.go).
var ipSets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER-FW",
	"KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
}

// removeIPSets destroys the IPVS mode's ipsets that exist. A kernel
// without ipset has none. It runs on a thread in the node's namespace.
func removeIPSets(rep *Report) error {
	if _, _, err := netlink.IpsetProtocol(); err != nil {
		return nil
	}
	// Listed first: the netlink library sends a destroy without asking
	// for an acknowledgement, so a missing set would look destroyed.
	sets, err := netlink.IpsetListAll()
	if err != nil {
		return fmt.Errorf("list the ipsets: %w", err)
	}
	var errs []error
	for _, set := range sets {
		if !slices.Contains(ipSets, set.SetName) {
			continue
		}
		if err := netlink.IpsetDestroy(set.SetName); err != nil {
			errs = append(errs, fmt.Errorf("destroy kube-proxy's ipset %s: %w", set.SetName, err))
			continue
		}
		rep.IPSets = append(rep.IPSets, set.SetName)
	}
	return errors.Join(errs...)
}
