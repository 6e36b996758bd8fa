/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The few kernel-internal structs kpr's socket iterator reads, written by
 * hand instead of taken from a generated vmlinux.h so that the build is the
 * same on every machine. Only the fields kpr reads are declared:
 * preserve_access_index makes clang record each access as a CO-RE
 * relocation, and the loader (cilium/ebpf) resolves it against the running
 * kernel's BTF, whatever the real layout is.
 */
#pragma once

#include <linux/types.h>

#define __kernel_struct __attribute__((preserve_access_index))

struct in6_addr___kpr {
	union {
		__u32 u6_addr32[4];
	} in6_u;
} __kernel_struct;

struct sock_common {
	__u32 skc_daddr;	/* IPv4 peer, network byte order */
	__u16 skc_dport;	/* peer port, network byte order */
	unsigned short skc_family;
	struct in6_addr___kpr skc_v6_daddr;
} __kernel_struct;

struct sock {
	struct sock_common __sk_common;
} __kernel_struct;

struct inet_sock {
	struct sock sk;
} __kernel_struct;

struct udp_sock {
	struct inet_sock inet;
} __kernel_struct;

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __kernel_struct;

/* The context of an iter/udp program. */
struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __kernel_struct;
