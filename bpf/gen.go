// Package bpf holds kpr's BPF C programs and the Go bindings bpf2go
// generates from them. The generated objects are committed, so building kpr
// needs no clang; `make generate` reproduces them.
package bpf

// The structs in lb.h reach Go only through -type: never redefine them.
// KPR_BPF_MULTIARCH names the host's multiarch include directory (for
// asm/types.h); `make generate` sets it from hack/multiarch.sh, so the same
// line works on x86-64 and arm64 build hosts.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/${KPR_BPF_MULTIARCH}" -target bpfel -type svc_key -type svc_value -type backend -type rev_nat_value -type sock_rev_key -type sock_rev_value -type affinity_key -type affinity_value -type affinity_match_key -type sock_term_key Kpr sock_lb.c -- -I.
