// Package bench is the head-to-head benchmark of kpr against upstream
// kube-proxy in its iptables and nftables modes (docs/benchmarks.md).
//
// Topology (all namespaces made by the harness, none touches the host's
// interfaces, routes or packet filter):
//
//	infra netns: etcd + kube-apiserver, 172.31.0.1 (advertise address)
//	   | node1 172.30.1.1/24              (one veth per node namespace)
//	   |
//	   | infra0 172.30.1.2/24, default route via 172.30.1.1
//	node netns (fresh for each proxy run): the proxy under test,
//	   eth0 192.168.100.10 (the Node's InternalIP), bridge 10.244.0.1/24,
//	   pods be-0..be-9 and alt-0..alt-9 (TCP echo on 8080)
//
// RunBenchmark (Config) creates the Services once per size and, for each proxy,
// a fresh node namespace where it measures the cold start, connection
// latency and network programming latency, with the proxy process's CPU
// time and peak RSS per phase (and kpr's BPF map memory). It writes
// results.json and results.md, and can regenerate docs/benchmarks.md;
// tests/bench/plot draws the PNG plots from results.json.
//
// Quick mode is the package's plain `go test`; the full run is `make bench`
// (see bench_test.go for the flags).
package bench
