package netfilter

import (
	"fmt"
	"net/netip"
	"strings"

	"go.uber.org/zap"
)

// Family is an IP family; iptables programs IPv4, ip6tables IPv6, each in
// tables of its own with the same chain names.
type Family uint8

const (
	IPv4 Family = iota
	IPv6
)

// Families are both families, in the order the backends write them.
var Families = []Family{IPv4, IPv6}

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// FamilyOf is the family of a (an IPv4-mapped IPv6 address is IPv4).
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Tools are the binaries of one family.
type Tools struct {
	Save, Restore string
	// SplitLines is the most lines of per-ServicePort chains one restore
	// should write: a larger write goes in several transactions. 0 never
	// splits.
	SplitLines int
}

// nftSplitLines bounds an iptables-nft transaction. iptables-nft-restore's
// time grows with the square of a transaction's size: the nat rules of
// 1,000 Services with 10 endpoints each (42,000 lines) take 7 s in one
// restore, of 4,000 Services 413 s, while 4,000 Services in transactions
// of about 4,000 lines take 4 s in all, and 10,000 Services 13 s.
// iptables-legacy-restore is not split: it rewrites the whole table
// whatever the transaction holds, so splitting would multiply its work.
const nftSplitLines = 4000

// Variant is which iptables implementation the node uses.
type Variant string

const (
	NFT    Variant = "nft"
	Legacy Variant = "legacy"
)

// Variants are both variants. Removal goes over both, since the node may
// have changed variant since the rules were written.
var Variants = []Variant{NFT, Legacy}

// FamiliesOf are the families tools has binaries for, in the order of
// Families.
func FamiliesOf(tools map[Family]Tools) []Family {
	var out []Family
	for _, f := range Families {
		if _, ok := tools[f]; ok {
			out = append(out, f)
		}
	}
	return out
}

// ToolsFor returns the binaries of variant for fam.
func ToolsFor(v Variant, fam Family) Tools {
	base := "iptables"
	if fam == IPv6 {
		base = "ip6tables"
	}
	t := Tools{Save: base + "-" + string(v) + "-save", Restore: base + "-" + string(v) + "-restore"}
	if v == NFT {
		t.SplitLines = nftSplitLines
	}
	return t
}

// DetectVariant decides, as kube-proxy's iptables-wrapper does, whether the
// node's rules live in iptables-nft or iptables-legacy: the one that holds
// more rules is the one the node's other components (kubelet, the CNI
// plugin) use, and kpr must write beside them, not in the other set that
// the kernel also runs. When both are equally empty it asks
// `iptables --version`, which prints "(nf_tables)" or "(legacy)", and
// prefers nft if that does not say. It returns the variant and why.
func DetectVariant(r Runner) (Variant, string, error) {
	nft, nftErr := countRules(r, "iptables-nft-save")
	legacy, legacyErr := countRules(r, "iptables-legacy-save")
	switch {
	case nftErr != nil && legacyErr != nil:
		return "", "", fmt.Errorf("neither iptables-nft-save nor iptables-legacy-save runs (%v; %v): install the iptables package", nftErr, legacyErr)
	case legacyErr != nil:
		return NFT, "iptables-legacy-save does not run", nil
	case nftErr != nil:
		return Legacy, "iptables-nft-save does not run", nil
	case legacy > nft:
		return Legacy, fmt.Sprintf("iptables-legacy holds %d rules, iptables-nft %d", legacy, nft), nil
	case nft > legacy:
		return NFT, fmt.Sprintf("iptables-nft holds %d rules, iptables-legacy %d", nft, legacy), nil
	}
	out, err := r.Run("iptables", []string{"--version"}, nil)
	if err == nil && strings.Contains(string(out), "(legacy)") {
		return Legacy, fmt.Sprintf("no rules in either; `iptables --version` says %q", strings.TrimSpace(string(out))), nil
	}
	return NFT, fmt.Sprintf("no rules in either; `iptables --version` says %q", strings.TrimSpace(string(out))), nil
}

func countRules(r Runner, save string) (int, error) {
	out, err := r.Run(save, nil, nil)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "-") {
			n++
		}
	}
	return n, nil
}

// NodeFamilies are the binaries to program the tables of the network
// namespace r runs in: of the variant DetectVariant picks, for IPv4, and
// for IPv6 too when ip6tables runs (a node without IPv6 serves only IPv4
// frontends, with a warning).
func NodeFamilies(r Runner, log *zap.Logger) (map[Family]Tools, error) {
	v, why, err := DetectVariant(r)
	if err != nil {
		return nil, err
	}
	log.Info("iptables variant selected", zap.String("variant", string(v)), zap.String("reason", why))
	fams := map[Family]Tools{IPv4: ToolsFor(v, IPv4)}
	v6 := ToolsFor(v, IPv6)
	if _, err := r.Run(v6.Save, []string{"-t", "nat"}, nil); err != nil {
		log.Warn("ip6tables does not run: IPv6 frontends are not served", zap.Error(err))
	} else {
		fams[IPv6] = v6
	}
	return fams, nil
}

// Masquerade says which ClusterIP traffic a backend marks for
// masquerading: all of it (kube-proxy's --masquerade-all), or what does not
// come from this node's pods (--detect-local-mode, by default the
// --cluster-cidr), so that a node reached through a static route to the
// Service range answers through itself. Neither marks none, as kube-proxy
// without a local-traffic detector.
type Masquerade struct {
	All bool
	// Local tells the pods' traffic from the rest; it also lets the pods'
	// traffic to a Local-policy external address go to every endpoint, as
	// kube-proxy's does.
	Local LocalTraffic
}
