// Package syncperf measures kpr's control plane against a real API server:
// how long `kpr run` takes from start to every Service programmed in the
// BPF maps, and how long an EndpointSlice update takes from the API to the
// maps (issue 3). The benchmarks are in bench_test.go; the results and the
// command that produced them are in docs/control-plane-performance.md.
package syncperf
