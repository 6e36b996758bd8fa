// Package iptables is kpr's iptables backend: a dataplane.Dataplane that
// renders the desired state into iptables-restore --noflush transactions,
// one per table and IP family, with kube-proxy's chain structure and chain
// names (KUBE-SERVICES, KUBE-SVC-*, KUBE-SVL-*, KUBE-EXT-*, KUBE-SEP-*,
// KUBE-NODEPORTS, KUBE-MARK-MASQ, KUBE-POSTROUTING), so that tools and
// runbooks written for kube-proxy's iptables mode read it unchanged.
//
// Rendering is a pure function of the desired state. The Plane runs
// iptables-restore and iptables-save through a netfilter.Runner, so that
// tests use an in-memory stand-in, and deletes the UDP conntrack entries
// the rules no longer match through a netfilter.UDPConntrack. What it shares
// with the IPVS backend (save parsing, restore input, chain removal,
// variant detection) lives in iptables-compat/netfilter.
//
// It must not import the eBPF backend's packages (bpf, maps, loader,
// ebpfplane, cilium/ebpf); make lint enforces it.
package iptables
