// Command kpr is a pure-eBPF replacement for kube-proxy, with iptables and
// IPVS fallbacks. `kpr run` is the node daemon; status, explain, trace,
// dump, probe and cleanup are for operators.
//
// Which backends exist, how each is chosen, built, inspected and cleaned
// up is one table of modes (modes.go). Each backend's row, with its
// constructor, flags and probe, is in the backend's own file (ebpf.go,
// iptables.go, ipvs.go); a backend may bring operator commands of its own
// through its row, as the eBPF mode's dump and trace (ebpf_*.go) read its
// maps. Only those files import a backend; everything else here is
// backend-neutral (docs/design.md, "How a backend plugs in").
// cleanup_kubeproxy.go is `kpr cleanup --kube-proxy`, which removes what
// upstream kube-proxy left: no mode of kpr's.
package main
