package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// TableName is the name of kpr's table. kube-proxy's is
// kube-proxy, so the two never share a table and `kpr cleanup
// --kube-proxy` leaves kpr's alone.
const TableName = "kpr"

// The shared chains and maps, as kube-proxy names its own.
const (
	chainNATPrerouting    = "nat-prerouting"
	chainNATOutput        = "nat-output"
	chainNATPostrouting   = "nat-postrouting"
	chainFilterPreDNAT    = "filter-prerouting-pre-dnat"
	chainFilterOutPreDNAT = "filter-output-pre-dnat"
	chainFilterInput      = "filter-input"
	chainFilterForward    = "filter-forward"
	chainFilterOutput     = "filter-output"
	chainServices         = "services"
	chainFirewallCheck    = "firewall-check"
	chainEndpointsCheck   = "service-endpoints-check"
	chainExternalCheck    = "external-endpoints-check"
	chainMasquerading     = "masquerading"
	chainMarkMasq         = "mark-for-masquerade"
	chainReject           = "reject-chain"

	mapServiceIPs       = "service-ips"
	mapNoEndpoints      = "no-endpoint-services"
	mapNoLocalEndpoints = "no-local-endpoints"
	mapFirewallIPs      = "firewall-ips"

	// setHairpin holds, per family, endpoint . endpoint . protocol . port
	// for every endpoint a service chain DNATs to directly: a connection
	// DNATed to its own source is masqueraded (hairpin).
	setHairpin = "hairpin-connections"
)

// Prefixes of the chains and sets a ServicePort owns. Each name is the
// prefix, a hash that makes it unique and a readable tail, as in
// kube-proxy (service-HASH-ns/name/tcp/port).
const (
	prefixService  = "service-"
	prefixLocal    = "local-"
	prefixExternal = "external-"
	prefixFirewall = "firewall-"
	prefixEndpoint = "endpoint-"
	prefixAffinity = "affinity-"
)

// masqMark is the packet mark bit kube-proxy uses for masquerading, in
// both of its netfilter modes (--iptables-masquerade-bit 14).
const masqMark = "0x00004000"

// maxNameLen is nftables' limit on a chain or set name, less one for the
// terminating NUL.
const maxNameLen = 255

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// hash8 is the first 8 characters of the base32 SHA-256 of s, upper case
// as kube-proxy's are.
func hash8(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:])[:8]
}

// portTail is a ServicePort's readable tail: ns/name/proto/port-name.
func portTail(n dataplane.ServicePortName) string {
	return n.Namespace + "/" + n.Name + "/" + netfilter.ProtoName(n.Protocol) + "/" + n.Port
}

// objectName is prefix, the hash of what makes the object unique, and
// tail, cut to nftables' limit.
func objectName(prefix, unique, tail string) string {
	s := prefix + hash8(unique) + "-" + tail
	if len(s) > maxNameLen {
		s = s[:maxNameLen]
	}
	return s
}

// portChain names a chain of ServicePort n: the prefix says its role,
// rank tells apart several of one role (see policies).
func portChain(prefix string, n dataplane.ServicePortName, fam netfilter.Family, rank int) string {
	unique := portTail(n) + " " + fam.String()
	if rank > 0 {
		unique += "#" + strconv.Itoa(rank)
	}
	return objectName(prefix, unique, portTail(n))
}

// endpointChain names the chain that DNATs n's traffic to b.
func endpointChain(n dataplane.ServicePortName, b dataplane.Backend) string {
	return objectName(prefixEndpoint, portTail(n)+" "+b.String(), portTail(n)+"__"+addrTail(b))
}

// affinitySet names the set of clients that stick to b for n, timeout
// seconds: a changed timeout is a new set, since a set's timeout is fixed
// when it is made.
func affinitySet(n dataplane.ServicePortName, b dataplane.Backend, timeout uint32) string {
	return objectName(prefixAffinity, portTail(n)+" "+b.String()+" "+strconv.FormatUint(uint64(timeout), 10), portTail(n)+"__"+addrTail(b))
}

// addrTail spells a backend in a name: 10.0.0.1/80, and an IPv6 address
// with dots for colons (fd00.10..1/80), which nft does not take in a
// name.
func addrTail(b dataplane.Backend) string {
	return strings.ReplaceAll(b.Addr.String(), ":", ".") + "/" + strconv.Itoa(int(b.Port))
}

// Family is the family of kpr's table: inet, which holds the rules of
// both IP families, so that one transaction writes them both.
const Family = knftables.InetFamily

// mapOf names fam's map of a shared verdict map: its keys hold fam's
// addresses.
func mapOf(base string, fam netfilter.Family) string {
	if fam == netfilter.IPv6 {
		return base + "-v6"
	}
	return base + "-v4"
}

// addrWord is the payload keyword of fam's addresses: ip or ip6.
func addrWord(fam netfilter.Family) string {
	if fam == netfilter.IPv6 {
		return "ip6"
	}
	return "ip"
}

// addrType is the nftables type of fam's addresses.
func addrType(fam netfilter.Family) string {
	if fam == netfilter.IPv6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// dnatTarget spells a backend as dnat takes it: [addr]:port for IPv6.
func dnatTarget(b dataplane.Backend) string {
	return netip.AddrPortFrom(b.Addr, b.Port).String()
}
