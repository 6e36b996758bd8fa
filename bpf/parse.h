/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The parse of a packet at tc, which every tc program starts with: the
 * node's devices (tc_nodeport.c) and the pods' (tc_pod.c) see the same
 * Ethernet frames.
 */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "pkt.h"
#include "frag.h"

/* The headers parse reads in place: Ethernet, IPv4 with the longest
 * options (or IPv6), and TCP up to its flags. Extension headers and L4
 * headers further on are read with bpf_skb_load_bytes. */
#define PARSE_LEN (ETH_HLEN + 60 + 14)

#define PARSED_L4 1
#define PARSED_ICMP 2

/*
 * Parse an Ethernet frame carrying IPv4 or IPv6 with TCP or UDP
 * (PARSED_L4), or ICMP (PARSED_ICMP: only the IP header is parsed).
 * Returns 0 for anything else. IPv6 extension headers are followed
 * (frag.h); a fragment of a TCP or UDP datagram is parsed with its
 * datagram's ports, a later one with pkt.frag_later set; fragments of ICMP
 * are left alone, as an ICMP error is never fragmented.
 */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct frag_key fk = {};
	__u8 frag = FRAG_NONE;
	__u16 ports[2];
	int proto;

	/* Headers outside the linear part (rare at tc) are pulled in once. */
	if (data + PARSE_LEN > data_end && skb->len > data_end - data) {
		bpf_skb_pull_data(skb, skb->len < PARSE_LEN ? skb->len : PARSE_LEN);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	p->l3_off = ETH_HLEN;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end)
			return 0;
		if (ip->version != 4 || ip->ihl < 5)
			return 0;
		proto = ip->protocol;
		if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_ICMP)
			return 0;
		if (ip->frag_off & bpf_htons(IPV4_MF | IPV4_OFFSET)) {
			frag = ip->frag_off & bpf_htons(IPV4_OFFSET) ? FRAG_LATER : FRAG_FIRST;
			fk.id = ip->id;
			fk.proto = proto;
		}
		addr_from_v4(p->saddr, ip->saddr);
		addr_from_v4(p->daddr, ip->daddr);
		p->l4_off = ETH_HLEN + ip->ihl * 4;
		p->v6 = 0;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end)
			return 0;
		proto = parse_ipv6_ext(skb, p, ip6->nexthdr, ETH_HLEN + sizeof(*ip6), &fk, &frag);
		if (proto == IPV6_EXT_UNPARSED) {
			STAT_INC(ipv6_ext_unparsed);
			return 0;
		}
		if (proto == IPV6_EXT_OTHER)
			return 0;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		/* The maps hold IPv4 as ::ffff:a.b.c.d, so an IPv6 packet
		 * with such an address would find IPv4 frontends, flows and
		 * source ranges: it is left to the kernel, which drops a
		 * v4-mapped source and has no v4-mapped address of its own. */
		if (addr_v4_mapped(p->saddr) || addr_v4_mapped(p->daddr)) {
			STAT_INC(v4_mapped);
			return 0;
		}
		p->v6 = 1;
	} else {
		return 0;
	}
	switch (proto) {
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		p->proto = proto;
		return frag == FRAG_NONE ? PARSED_ICMP : 0;
	case IPPROTO_TCP:
	case IPPROTO_UDP:
		break;
	case IPPROTO_DSTOPTS:
		/* A later IPv6 fragment whose first fragment has destination
		 * options before its L4 header. */
		if (frag == FRAG_LATER)
			break;
		return 0;
	default:
		return 0;
	}
	if (frag != FRAG_NONE) {
		addr_copy(fk.saddr, p->saddr);
		addr_copy(fk.daddr, p->daddr);
	}
	if (frag == FRAG_LATER)
		return frag_follow(&fk, p) ? PARSED_L4 : 0;
	if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)))
		return 0;
	p->proto = proto;
	p->sport = ports[0];
	p->dport = ports[1];
	p->tcp_flags = 0;
	if (proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, p->l4_off + 13, &p->tcp_flags, 1))
		return 0;
	if (frag == FRAG_FIRST)
		frag_record(&fk, p);
	return PARSED_L4;
}
