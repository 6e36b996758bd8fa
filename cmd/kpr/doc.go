// Command kpr is a pure-eBPF replacement for kube-proxy. `kpr run` is the
// node daemon; dump, probe and cleanup are for operators.
//
// Files: main.go (the root command and logging), run.go (`kpr run`),
// mode.go (the mode factory: which dataplane runs), ebpf.go (building the
// eBPF backend), dump.go, probe.go and cleanup.go (operator commands).
package main
