/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The refusal of a pod's new flow to a frontend without a backend, as
 * kube-proxy's REJECT rule refuses it: the packet becomes the answer in
 * place and goes back out of the pod's device, so that the pod learns at
 * once rather than after its timeouts.
 *
 * UDP gets ICMP port unreachable (pmtu.h builds it). TCP gets a reset
 * from the frontend instead: an ICMP error that reaches a socket while
 * its owner holds the socket's lock is only a soft error, and the answer
 * to a SYN comes back from the pod's own device while connect() still
 * holds it, so the connect waits for its SYN's retransmit a second later.
 * A reset waits in the socket's backlog for the lock, and refuses the
 * connect at once.
 */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "pkt.h"
#include "pmtu.h"

/* A TCP header without options, as the reset carries it. */
struct reject_tcphdr {
	__u16 source;
	__u16 dest;
	__u32 seq;
	__u32 ack_seq;
	__u8 doff;	/* the header's length in 32-bit words, in the high 4 bits */
	__u8 flags;
	__u16 window;
	__u16 check;
	__u16 urg_ptr;
};

/* The reset's TCP header, with its checksum over sum (the pseudo-header's
 * sum), and the packet cut to it; l3len is the new IP header's length in
 * b->l3. Returns 0 on success; on failure the packet may be half
 * rewritten, and must be dropped. */
static __always_inline int reject_emit(struct __sk_buff *skb, struct pmtu_scratch *b,
				       struct reject_tcphdr *th, __s64 sum, __u32 l3len)
{
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)th, sizeof(*th), sum);
	if (sum < 0)
		return -1;
	th->check = pmtu_csum_fold(sum);
	if (bpf_skb_change_tail(skb, ETH_HLEN + l3len + sizeof(*th), 0))
		return -1;
	if (bpf_skb_store_bytes(skb, 0, &b->macs[ETH_ALEN], ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, b->macs, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, b->l3, l3len, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + l3len, th, sizeof(*th), 0))
		return -1;
	return 0;
}

/* Turn a SYN into the reset that refuses it: from the frontend, acking
 * the SYN (RFC 9293: a reset to a segment without ACK has sequence number
 * 0 and acknowledges it). The buffers are pmtu.h's. */
static __always_inline int reject_reset(struct __sk_buff *skb, const struct pkt *p, struct pmtu_scratch *b)
{
	struct reject_tcphdr *th = (void *)b->quote;
	__u32 seq;

	if (bpf_skb_load_bytes(skb, p->l4_off + 4, &seq, sizeof(seq)) ||
	    bpf_skb_load_bytes(skb, 0, b->macs, sizeof(b->macs)))
		return -1;
	__builtin_memset(b->l3, 0, sizeof(b->l3));
	__builtin_memset(th, 0, sizeof(*th));
	th->source = p->dport;
	th->dest = p->sport;
	th->ack_seq = bpf_htonl(bpf_ntohl(seq) + 1);
	th->doff = (sizeof(*th) / 4) << 4;
	th->flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	if (p->v6) {
		struct ipv6hdr *ip6 = (void *)b->l3;

		ip6->version = 6;
		ip6->payload_len = bpf_htons(sizeof(*th));
		ip6->nexthdr = IPPROTO_TCP;
		ip6->hop_limit = PMTU_TTL;
		__builtin_memcpy(&ip6->saddr, p->daddr, 16);
		__builtin_memcpy(&ip6->daddr, p->saddr, 16);
		addr_copy(b->ph.saddr, p->daddr);
		addr_copy(b->ph.daddr, p->saddr);
		b->ph.len = bpf_htonl(sizeof(*th));
		b->ph.next = bpf_htonl(IPPROTO_TCP);
		return reject_emit(skb, b, th, bpf_csum_diff(NULL, 0, (__be32 *)&b->ph, sizeof(b->ph), 0),
				   sizeof(*ip6));
	} else {
		struct iphdr *ip = (void *)b->l3;

		if (pmtu_ip4_back(ip, p, IPPROTO_TCP, sizeof(*th)))
			return -1;
		/* IPv4's pseudo-header: the addresses, then zero, the
		 * protocol and the TCP length in one 32-bit word. */
		b->ph.saddr[0] = p->daddr[3];
		b->ph.saddr[1] = p->saddr[3];
		b->ph.saddr[2] = bpf_htonl(IPPROTO_TCP << 16 | sizeof(*th));
		return reject_emit(skb, b, th, bpf_csum_diff(NULL, 0, (__be32 *)b->ph.saddr, 12, 0), sizeof(*ip));
	}
}

/*
 * Refuse a pod's new flow to a frontend without a backend: a TCP SYN gets
 * a reset, a UDP datagram ICMP port unreachable, each back out of the
 * device the packet came in on. Out of line for the reason pmtu_too_big
 * is.
 */
static __noinline int reject_new_flow(struct __sk_buff *skb, const struct pkt *p)
{
	struct pmtu_scratch *b;
	int err;

	b = bpf_map_lookup_elem(&kpr_tc_pmtu_scratch, (const void *)&pmtu_scratch_key);
	if (!b)
		return TC_ACT_SHOT;
	if (p->proto == IPPROTO_TCP)
		err = reject_reset(skb, p, b);
	else
		err = pmtu_make_error(skb, p, b, ICMP_ERR_PORT_UNREACH);
	if (err) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(rejected);
	return bpf_redirect(skb->ingress_ifindex, 0);
}
