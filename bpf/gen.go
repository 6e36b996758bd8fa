// Package bpf holds kpr's BPF C programs and the Go bindings bpf2go
// generates from them. The generated objects are committed, so building kpr
// needs no clang; `make generate` reproduces them.
//
// Each .c file is one program object: sock_lb.c the socket hooks (Kpr),
// sock_term.c the socket-termination iterator (SockTerm), tc_nodeport.c the
// packet-level translation at tc for traffic from other machines
// (TcNodeport), tc_pod.c the same for the pods the socket hooks leave to
// the packet path (TcPod). They share the pinned maps of maps.h and the types of
// types.h; the socket hooks and the tc programs share their backend pick
// (lb.h), and the tc programs keep each concern in a header of its own.
package bpf

// The structs and enums of types.h reach Go only through bpf2go: never
// redefine them. They are generated once, from the Kpr object (whose BTF
// carries every one of them); the other objects use -no-global-types, so
// that each type has one Go name. bpf2go generates the types of maps and
// variables without -type; the types only Go uses (enum svc_kind, struct
// sock_term_key) reach it through the variables in sock_lb.c that exist
// for that, and naming them in -type too would generate them twice. The
// trace record (struct trace_event, with enum sock_hook and enum
// sock_verdict) is in BTF because the out-of-line trace_emit takes it, and
// no map or variable has it: it comes through -type. So does enum
// sock_bypass_reason, which BTF carries as the type of a field of struct
// sock_bypass but bpf2go only names when asked.
//
// KPR_BPF_MULTIARCH names the host's multiarch include directory (for
// asm/types.h); `make generate` sets it from hack/multiarch.sh, so the same
// lines work on x86-64 and arm64 build hosts.
//go:generate -command bpf2go go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/${KPR_BPF_MULTIARCH}" -target bpfel
//go:generate bpf2go -type svc_key -type svc_value -type backend -type rev_nat_value -type sock_rev_key -type sock_rev_value -type affinity_key -type affinity_value -type affinity_match_key -type sock_hook -type sock_verdict -type sock_bypass_reason -type trace_event Kpr sock_lb.c -- -I.
//go:generate bpf2go -no-global-types SockTerm sock_term.c -- -I.
//go:generate bpf2go -no-global-types TcNodeport tc_nodeport.c -- -I.
//go:generate bpf2go -no-global-types TcPod tc_pod.c -- -I.
