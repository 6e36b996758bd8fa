// Package ipvs is kpr's IPVS backend: a dataplane.Dataplane that programs
// the kernel's IPVS virtual servers through netlink (github.com/moby/ipvs,
// the library kube-proxy's IPVS mode uses), binds the virtual addresses to
// a dummy interface of kpr's own, and keeps the ipsets and iptables rules
// that IPVS needs for masquerade, NodePorts and loadBalancerSourceRanges,
// as kube-proxy's IPVS mode (pkg/proxy/ipvs) has them.
//
// Every name it writes is kpr's own, not kube-proxy's: the dummy interface
// is kpr-ipvs0 (kube-proxy's is kube-ipvs0), the ipsets are KPR-* and the
// chains KPR-IPVS-*. So switching between kpr's iptables and IPVS modes,
// or between kube-proxy and kpr, removes exactly the previous one's state:
// the iptables mode's KUBE-SERVICES and kube-proxy's kube-ipvs0 are never
// mistaken for this backend's, nor this backend's for theirs.
//
// The desired state is a pure function of the ServicePorts; the Plane
// diffs it against what the kernel holds and writes the difference through
// a Kernel and a netfilter.Runner, so that tests use in-memory stand-ins or
// a network namespace of their own. Removed real servers drain (the
// reaper): weight 0 first, deleted once they have no connections left, UDP
// ones at once.
//
// The addresses on the dummy interface are the node's own, so kube-proxy's
// protections come along: KPR-IPVS-FILTER (kube-proxy's KUBE-IPVS-FILTER)
// rejects new connections to them on ports no Service has, and
// SetSysctls(true) is --ipvs-strict-arp.
//
// It must not import the eBPF backend's packages (bpf, maps, loader,
// ebpfplane, cilium/ebpf); make lint enforces it.
package ipvs
