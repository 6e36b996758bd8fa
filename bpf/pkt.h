/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What every header of the tc programs (tc_nodeport.c) works on: the packet
 * as parse() there reads it (struct pkt), the verdict that lets a packet
 * through, the TCP flags conntrack reads, the counters, and the hash that
 * picks a new flow's backend and SNAT port.
 *
 * pkt.h, ct.h, nat.h, fib.h and icmp.h are the tc object's alone: the
 * constants the loader sets and the maps they define are its own, and
 * reach Go as TcNodeport's. What the socket hooks share is in lb.h.
 */
#pragma once

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>

#include "types.h"
#include "maps.h"
#include "lb.h"

/* A packet kpr lets through, translated or not, goes on to the next program
 * on the device (TCX_NEXT for tcx, the next filter for clsact), and is
 * passed when there is none: kpr shares the device with other tools. */
#define TC_PASS TC_ACT_UNSPEC

/* The flags byte of a TCP header. linux/tcp.h names them too, as bits of
 * a 32-bit word; these, defined after it, are what the programs use. */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* The parts of a packet the programs look at. Ports in network order. */
struct pkt {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u32 l3_off;
	__u32 l4_off;
	__u8 proto;
	__u8 tcp_flags;
	__u8 v6;
	__u8 frag_later;	/* a later IP fragment: no L4 header at l4_off;
				 * ports and tcp_flags are its first fragment's
				 * (frag.h) */
};

/* Count an event in kpr_tc_stats (struct nat_stats), per CPU. */
#define STAT_INC(field)                                                \
	do {                                                           \
		__u32 zero = 0;                                        \
		struct nat_stats *s = bpf_map_lookup_elem(&kpr_tc_stats, &zero); \
		if (s)                                                 \
			s->field++;                                    \
	} while (0)

/*
 * The backend of a new flow is a function of the flow: should its conntrack
 * entry be lost (evicted from the LRU map), its next packet picks the same
 * backend while the Service's backends stay the same. The hash leaves out
 * the destination address, so a NodePort reached at either of a node's
 * addresses picks alike; and it is a function of the packet and seed
 * alone, so every node with the same Maglev table and seed picks the same
 * backend. seed is a secret (the node's, lb_node_seed, or the cluster's
 * for Maglev): without it an outsider could choose flows that all land on
 * one backend, or predict a flow's SNAT port.
 */
static __always_inline __u32 flow_hash(const struct pkt *p, __u64 seed)
{
	__u64 a = ((__u64)(p->saddr[0] ^ p->saddr[2]) << 32) | (p->saddr[1] ^ p->saddr[3]);
	__u64 b = ((__u64)p->sport << 16 | p->dport) ^ ((__u64)p->proto << 32);

	return lb_hash64(a ^ lb_hash64(b ^ seed));
}
