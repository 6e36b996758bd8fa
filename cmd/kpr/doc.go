// Command kpr is a pure-eBPF replacement for kube-proxy, with iptables and
// IPVS fallbacks. `kpr run` is the node daemon; status, explain, trace,
// dump, probe and cleanup are for operators.
//
// Which backends exist, how each is chosen, built, inspected and cleaned
// up is one table of modes; everything else here is backend-neutral
// (docs/design.md, "How a backend plugs in").
package main
