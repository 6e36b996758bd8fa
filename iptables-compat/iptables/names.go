package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Chains every sync writes in full. The names are kube-proxy's, so that a
// node moving between kube-proxy and kpr has one set of chains.
const (
	chainServices         = "KUBE-SERVICES"
	chainNodePorts        = "KUBE-NODEPORTS"
	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	chainForward          = "KUBE-FORWARD"
	chainPostrouting      = "KUBE-POSTROUTING"
	chainMarkMasq         = "KUBE-MARK-MASQ"
	// chainProxyFirewall (filter) drops what a KUBE-FW-* chain did not
	// let through to be DNATed: new connections to a load-balancer IP
	// from outside its loadBalancerSourceRanges.
	chainProxyFirewall = "KUBE-PROXY-FIREWALL"
	// chainFirewall (filter) is the kubelet's and kube-proxy's
	// KUBE-FIREWALL: it drops packets from outside to 127.0.0.0/8, which
	// route_localnet would otherwise let in.
	chainFirewall = "KUBE-FIREWALL"
)

// masqMark is kube-proxy's default masquerade mark (--iptables-masquerade-bit
// 14): packets carrying it are masqueraded in KUBE-POSTROUTING.
const masqMark = "0x4000"

// Prefixes of the per-ServicePort chains. A full sync deletes every chain
// with one of them that no ServicePort owns, as kube-proxy does.
const (
	prefixClusterPolicy = "KUBE-SVC-"
	prefixLocalPolicy   = "KUBE-SVL-"
	prefixExternal      = "KUBE-EXT-"
	prefixEndpoint      = "KUBE-SEP-"
	prefixFirewall      = "KUBE-FW-"
)

var servicePortPrefixes = []string{prefixClusterPolicy, prefixLocalPolicy, prefixExternal, prefixEndpoint, prefixFirewall}

// ownedChain reports whether name is a per-ServicePort chain of the kind
// kpr (and kube-proxy) writes.
func ownedChain(name string) bool {
	for _, p := range servicePortPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// portName is the ServicePort's name as kube-proxy prints it (and hashes
// it): "namespace/name", with ":port" for a named port.
func portName(n dataplane.ServicePortName) string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s
}

// hash16 is kube-proxy's chain-name hash: the first 16 characters of the
// base32 of the SHA-256 of s. Chain names must stay within 28 characters.
func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func portProtoHash(n dataplane.ServicePortName) string {
	return hash16(portName(n) + netfilter.ProtoName(n.Protocol))
}

// clusterChain is KUBE-SVC-<hash>: every endpoint the ServicePort has.
func clusterChain(n dataplane.ServicePortName) string { return prefixClusterPolicy + portProtoHash(n) }

// localChain is KUBE-SVL-<hash>: the node-local endpoints, for a Local
// traffic policy.
func localChain(n dataplane.ServicePortName) string { return prefixLocalPolicy + portProtoHash(n) }

// externalChain is KUBE-EXT-<hash>: where NodePort, external and
// load-balancer traffic enters, to pick the policy chain and masquerade.
func externalChain(n dataplane.ServicePortName) string { return prefixExternal + portProtoHash(n) }

// firewallChain is KUBE-FW-<hash>: load-balancer traffic of a ServicePort
// with loadBalancerSourceRanges enters here, and only sources inside them
// go on to KUBE-EXT-*.
func firewallChain(n dataplane.ServicePortName) string { return prefixFirewall + portProtoHash(n) }

// endpointChain is KUBE-SEP-<hash> of one endpoint of the ServicePort.
func endpointChain(n dataplane.ServicePortName, b dataplane.Backend) string {
	ep := netip.AddrPortFrom(b.Addr.Unmap(), b.Port).String()
	return prefixEndpoint + hash16(portName(n)+netfilter.ProtoName(n.Protocol)+ep)
}
