// Package netfilter is the toolbox the netfilter-based backends share:
// kpr's iptables and IPVS modes, and the removal of upstream kube-proxy's
// leftovers. It holds what each of them needs from the node's netfilter
// and what none of them should own alone: running the iptables binaries
// (in kpr's network namespace or another), picking the variant the node
// uses (nft or legacy), reading iptables-save output with iptables'
// own quoting, writing iptables-restore input with the jumps from the
// built-in chains, removing chains and the rules that jump to them,
// deleting conntrack entries through netlink, the bridge-netfilter check
// and the IPVS availability probe.
//
// It plays the part of kube-proxy's pkg/util/{iptables,ipset,ipvs}: the
// backends are siblings on top of it and never import each other, so that
// one backend's rendering or state is never another's dependency, and a
// new netfilter backend starts from the same tools. Nothing here knows a
// backend's chain names.
//
// It must not import the eBPF backend's packages (bpf, maps, loader,
// ebpfplane, cilium/ebpf); make lint enforces it.
package netfilter
