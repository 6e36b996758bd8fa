package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The chains the Plane writes, every one in full on each write of its
// table. kube-proxy's IPVS mode has the same chains as KUBE-SERVICES,
// KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-PROXY-FIREWALL and KUBE-FORWARD;
// kpr's names keep them apart from its iptables mode's (see doc.go).
const (
	chainServices    = "KPR-IPVS-SERVICES"
	chainInternal    = "KPR-IPVS-INTERNAL"
	chainPostrouting = "KPR-IPVS-POSTROUTING"
	chainMarkMasq    = "KPR-IPVS-MARK-MASQ"
	chainFirewall    = "KPR-IPVS-FIREWALL"
	chainForward     = "KPR-IPVS-FORWARD"
	// chainAccessFilter is kube-proxy's KUBE-IPVS-FILTER.
	chainAccessFilter = "KPR-IPVS-FILTER"
	chainPrefix       = "KPR-IPVS-"
)

const (
	tableNAT    = "nat"
	tableFilter = "filter"
)

var tables = []string{tableNAT, tableFilter}

// baseJumps send traffic from the built-in chains to the Plane's chains.
var baseJumps = []netfilter.BaseJump{
	jump(tableNAT, "PREROUTING", "", chainServices),
	jump(tableNAT, "OUTPUT", "", chainServices),
	jump(tableNAT, "POSTROUTING", "", chainPostrouting),
	// Before IPVS sees the packet in LOCAL_IN: filter runs first there.
	jump(tableFilter, "INPUT", "-m conntrack --ctstate NEW", chainFirewall),
	jump(tableFilter, "FORWARD", "", chainForward),
	jump(tableFilter, "INPUT", "", chainAccessFilter),
}

// jumpComment marks the base jumps as the IPVS mode's.
const jumpComment = "kpr ipvs"

func jump(table, builtin, match, target string) netfilter.BaseJump {
	return netfilter.BaseJump{Table: table, Chain: builtin, Match: match, Comment: jumpComment, Target: target}
}

// chainsOf are the chains the Plane owns in table.
func chainsOf(table string) []string {
	if table == tableNAT {
		return []string{chainServices, chainInternal, chainPostrouting, chainMarkMasq}
	}
	return []string{chainFirewall, chainForward, chainAccessFilter}
}

// ruleSet is what the Plane writes into one family's tables.
type ruleSet struct {
	fam netfilter.Family
	// masqAll is --masquerade-all: every connection to a ClusterIP is
	// masqueraded, and clusterCIDRs do not matter.
	masqAll bool
	// notLocal matches the family's traffic from anything but this
	// node's pods (--detect-local-mode): its traffic to ClusterIPs is
	// masqueraded too, as kube-proxy does. nil when not told apart.
	notLocal []string
	// internal maps frontends to the marks of their node-traffic virtual
	// servers.
	internal map[ServiceKey]uint32
}

// newRuleSet is the ruleSet of fam under masq.
func newRuleSet(fam netfilter.Family, masq netfilter.Masquerade, internal map[ServiceKey]uint32) ruleSet {
	return ruleSet{fam: fam, masqAll: masq.All, notLocal: masq.Local.IPTablesNotLocal(fam), internal: internal}
}

// render is the iptables-restore --noflush input that writes table,
// inserting jumps first. Declaring a chain creates or flushes it.
func (rs ruleSet) render(table string, jumps []netfilter.BaseJump) []byte {
	return netfilter.Restore(table, func(w netfilter.RestoreInput) {
		for _, c := range chainsOf(table) {
			w.Declare(c)
		}
		for _, j := range jumps {
			w.InsertJump(j)
		}
		w.Rules(rs.rules(table))
	})
}

func (rs ruleSet) set(role string) string { return setName(role, rs.fam == netfilter.IPv6) }

// rules are the table's rules, in iptables-save's spelling, so that a
// drift check compares them as text.
func (rs ruleSet) rules(table string) []string {
	masq := fmt.Sprintf("0x%x", masqMark)
	if table == tableFilter {
		reject := "icmp-port-unreachable"
		if rs.fam == netfilter.IPv6 {
			reject = "icmp6-port-unreachable"
		}
		out := []string{
			"-A " + chainFirewall + " -m set --match-set " + rs.set(setFirewall) + " dst,dst -m set ! --match-set " +
				rs.set(setSourceCIDR) + " dst,dst,src -j DROP",
			"-A " + chainForward + " -m mark --mark " + masq + "/" + masq + " -j ACCEPT",
			"-A " + chainForward + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		}
		// The Service addresses on the dummy interface are the node's
		// own, so without this every port the node listens on (sshd,
		// the kubelet) would answer on every ClusterIP, external IP and
		// load-balancer IP (kubernetes#72236). A new connection to one
		// of them that is not for one of its Services' ports is
		// rejected, as kube-proxy's KUBE-IPVS-FILTER rejects it; the
		// frontends of every kind are in the three sets, and the
		// healthCheckNodePorts on their Services' addresses in the fourth.
		for _, role := range []string{setClusterIP, setExternal, setExternalLocal, setHealthCheck} {
			out = append(out, "-A "+chainAccessFilter+" -m set --match-set "+rs.set(role)+" dst,dst -j RETURN")
		}
		return append(out, "-A "+chainAccessFilter+" -m conntrack --ctstate NEW -m set --match-set "+rs.set(setBound)+
			" dst -j REJECT --reject-with "+reject)
	}
	out := []string{
		// The node's own traffic to a frontend whose outside traffic
		// gets other backends meets its fwmark virtual server.
		"-A " + chainServices + " -m addrtype --src-type LOCAL -j " + chainInternal,
	}
	clusterIPs := "-m set --match-set " + rs.set(setClusterIP) + " dst,dst -j " + chainMarkMasq
	if rs.masqAll {
		// kube-proxy's --masquerade-all: one rule, where the
		// --cluster-cidr ones would be, that also covers the node's own
		// traffic.
		out = append(out, "-A "+chainServices+" "+clusterIPs)
	} else {
		out = append(out, "-A "+chainServices+" -m addrtype --src-type LOCAL "+clusterIPs)
		if rs.notLocal != nil {
			out = append(out, "-A "+chainServices+" "+strings.Join(rs.notLocal, " ")+" "+clusterIPs)
		}
	}
	out = append(out,
		"-A "+chainServices+" -m set --match-set "+rs.set(setExternal)+" dst,dst -j "+chainMarkMasq,
		"-A "+chainServices+" -m addrtype --src-type LOCAL -m set --match-set "+rs.set(setExternalLocal)+" dst,dst -j "+chainMarkMasq,
	)
	out = append(out, internalRules(rs.fam, rs.internal)...)
	out = append(out,
		"-A "+chainPostrouting+" -m set --match-set "+rs.set(setLoopBack)+" dst,dst,src -j MASQUERADE",
		"-A "+chainPostrouting+" -m mark ! --mark "+masq+"/"+masq+" -j RETURN",
		// Cleared so that a packet is not masqueraded twice should it
		// pass netfilter again.
		"-A "+chainPostrouting+" -j MARK --set-xmark "+masq+"/0x0",
		"-A "+chainPostrouting+" -j MASQUERADE --random-fully",
		"-A "+chainMarkMasq+" -j MARK --set-xmark "+masq+"/"+masq,
	)
	return out
}

// internalRules mark the node's own new connections to the frontends of
// the family, in frontend order.
func internalRules(fam netfilter.Family, internal map[ServiceKey]uint32) []string {
	keys := make([]ServiceKey, 0, len(internal))
	for k := range internal {
		if k.IPv6 == (fam == netfilter.IPv6) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		p := netfilter.ProtoName(k.Proto)
		out = append(out, fmt.Sprintf("-A %s -d %s -p %s -m %s --dport %d -j MARK --set-xmark 0x%x/0xffffffff",
			chainInternal, netip.PrefixFrom(k.Addr, k.Addr.BitLen()), p, p, k.Port, internal[k]))
	}
	return out
}

func compareKeys(a, b ServiceKey) int {
	switch {
	case a.IPv6 != b.IPv6:
		if a.IPv6 {
			return 1
		}
		return -1
	case a.FWMark != b.FWMark:
		return int(a.FWMark) - int(b.FWMark)
	}
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Proto != b.Proto {
		return int(a.Proto) - int(b.Proto)
	}
	return int(a.Port) - int(b.Port)
}

// parseInternal reads the marks back from the rules of chainInternal.
func parseInternal(t *netfilter.SavedTable) map[ServiceKey]uint32 {
	out := map[ServiceKey]uint32{}
	for _, r := range t.ChainRules(chainInternal) {
		arg := func(flag string) string { return netfilter.RuleArg(r, flag) }
		d, err := netip.ParsePrefix(arg("-d"))
		if err != nil {
			if a, aerr := netip.ParseAddr(arg("-d")); aerr == nil {
				d = netip.PrefixFrom(a, a.BitLen())
			} else {
				continue
			}
		}
		port, err := strconv.Atoi(arg("--dport"))
		if err != nil {
			continue
		}
		markArg, _, _ := strings.Cut(arg("--set-xmark"), "/")
		mark, err := strconv.ParseUint(strings.TrimPrefix(markArg, "0x"), 16, 32)
		if err != nil {
			continue
		}
		out[addrKey(d.Addr(), netfilter.ParseProto(arg("-p")), uint16(port))] = uint32(mark)
	}
	return out
}
