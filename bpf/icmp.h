/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP errors about the flows of the tc programs, translated like the flow
 * they quote, so that path MTU discovery and unreachable notices work
 * through a NodePort. Rare, and read with bpf_skb_load_bytes: not the hot
 * path.
 */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/stddef.h>
#include <bpf/bpf_helpers.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "pkt.h"
#include "ct.h"

/* From linux/icmp.h and linux/icmpv6.h, which pull in libc headers. */
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3

/*
 * The packet an ICMP error is about: destination unreachable (which
 * carries "fragmentation needed" and "packet too big") or time exceeded,
 * quoting an IP header and the first 8 bytes of TCP or UDP. Read with
 * bpf_skb_load_bytes: this is not the hot path. Returns 0 for any other
 * ICMP message.
 */
static __always_inline int parse_icmp_error(struct __sk_buff *skb, const struct pkt *p, struct pkt *in)
{
	__u8 type, ports[4];

	if (bpf_skb_load_bytes(skb, p->l4_off, &type, 1))
		return 0;
	if (p->v6 ? type != ICMPV6_DEST_UNREACH && type != ICMPV6_PKT_TOOBIG && type != ICMPV6_TIME_EXCEED
		  : type != ICMP_DEST_UNREACH && type != ICMP_TIME_EXCEEDED)
		return 0;
	in->l3_off = p->l4_off + 8;
	in->v6 = p->v6;
	if (!p->v6) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, in->l3_off, &ip, sizeof(ip)) || ip.version != 4 || ip.ihl < 5)
			return 0;
		in->proto = ip.protocol;
		addr_from_v4(in->saddr, ip.saddr);
		addr_from_v4(in->daddr, ip.daddr);
		in->l4_off = in->l3_off + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, in->l3_off, &ip6, sizeof(ip6)))
			return 0;
		in->proto = ip6.nexthdr;
		__builtin_memcpy(in->saddr, &ip6.saddr, 16);
		__builtin_memcpy(in->daddr, &ip6.daddr, 16);
		/* Never an IPv4 flow's entry (parse() says why). */
		if (addr_v4_mapped(in->saddr) || addr_v4_mapped(in->daddr))
			return 0;
		in->l4_off = in->l3_off + sizeof(ip6);
	}
	if (in->proto != IPPROTO_TCP && in->proto != IPPROTO_UDP)
		return 0;
	if (bpf_skb_load_bytes(skb, in->l4_off, ports, sizeof(ports)))
		return 0;
	__builtin_memcpy(&in->sport, &ports[0], 2);
	__builtin_memcpy(&in->dport, &ports[2], 2);
	return 1;
}

/* Rewrite the source (dst == 0) or destination address of an ICMP
 * message's own IP header; ICMPv6 has it in its checksum's pseudo-header. */
static __always_inline int rewrite_icmp_outer(struct __sk_buff *skb, const struct pkt *p, int dst,
					      const __u32 old_addr[4], const __u32 new_addr[4])
{
	__s64 diff;

	if (p->v6) {
		diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, p->l4_off + 2, 0, diff, BPF_F_PSEUDO_HDR))
			return -1;
		return bpf_skb_store_bytes(skb, p->l3_off + (dst ? offsetof(struct ipv6hdr, daddr)
								 : offsetof(struct ipv6hdr, saddr)),
					   new_addr, 16, 0) ? -1 : 0;
	}
	if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), old_addr[3], new_addr[3], 4))
		return -1;
	return bpf_skb_store_bytes(skb, p->l3_off + (dst ? offsetof(struct iphdr, daddr)
							 : offsetof(struct iphdr, saddr)),
				   &new_addr[3], 4, 0) ? -1 : 0;
}

/*
 * Rewrite the source (dst == 0) or destination address and port of the
 * packet an ICMP error quotes. The quoted IPv4 header checksum and the ICMP
 * checksum, which covers the quote, are fixed; the quoted TCP or UDP
 * checksum is left as it is, since receivers of ICMP errors ignore it.
 */
static __always_inline int rewrite_quoted(struct __sk_buff *skb, const struct pkt *p, const struct pkt *in,
					  int dst, const __u32 old_addr[4], const __u32 new_addr[4],
					  __u16 old_port, __u16 new_port)
{
	__u32 icmp_csum = p->l4_off + 2;
	__s64 diff;

	if (in->v6) {
		diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, icmp_csum, 0, diff, 0))
			return -1;
		if (bpf_skb_store_bytes(skb, in->l3_off + (dst ? offsetof(struct ipv6hdr, daddr)
								: offsetof(struct ipv6hdr, saddr)),
					new_addr, 16, 0))
			return -1;
	} else {
		__u32 check_off = in->l3_off + offsetof(struct iphdr, check);
		__u16 old_check, new_check;

		if (bpf_skb_load_bytes(skb, check_off, &old_check, 2) ||
		    bpf_l3_csum_replace(skb, check_off, old_addr[3], new_addr[3], 4) ||
		    bpf_skb_load_bytes(skb, check_off, &new_check, 2))
			return -1;
		if (bpf_l4_csum_replace(skb, icmp_csum, old_addr[3], new_addr[3], 4) ||
		    bpf_l4_csum_replace(skb, icmp_csum, old_check, new_check, 2))
			return -1;
		if (bpf_skb_store_bytes(skb, in->l3_off + (dst ? offsetof(struct iphdr, daddr)
								: offsetof(struct iphdr, saddr)),
					&new_addr[3], 4, 0))
			return -1;
	}
	if (old_port == new_port)
		return 0;
	if (bpf_l4_csum_replace(skb, icmp_csum, old_port, new_port, 2))
		return -1;
	return bpf_skb_store_bytes(skb, in->l4_off + (dst ? 2 : 0), &new_port, 2, 0) ? -1 : 0;
}

/*
 * Ingress: an ICMP error about a packet of a translated flow, so that path
 * MTU discovery works through a NodePort. Either about a reply kpr sent to
 * the client (quoting frontend -> client, from somewhere on the path to the
 * client): it goes to the backend, about the packet as the backend sent it
 * (from the node's SNAT address and port, for a SNATed flow). Or, for a
 * SNATed flow, about a packet kpr sent to the backend on another node
 * (quoting node -> backend): it goes to the client, about the packet the
 * client sent. The kernel routes the translated error on.
 */
static __always_inline int icmp_ingress(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key key = {};
	const struct ct_value *ct;
	struct ct_value e;
	struct pkt in = {};
	int err;

	if (!parse_icmp_error(skb, p, &in))
		return TC_PASS;
	ct_key_of(&key, in.daddr, in.dport, in.saddr, in.sport, in.proto, CT_DIR_FORWARD);
	ct = ct_lookup(&key);
	if (ct) {
		e = *ct;
		err = (addr_eq(p->daddr, in.saddr) && rewrite_icmp_outer(skb, p, 1, p->daddr, e.addr)) ||
		      rewrite_quoted(skb, p, &in, 0, in.saddr, e.addr, in.sport, e.port);
		if (!err && (e.flags & CT_F_SNAT))
			err = rewrite_quoted(skb, p, &in, 1, in.daddr, e.nat_addr, in.dport, e.nat_port);
	} else {
		key.dir = CT_DIR_REPLY;
		ct = ct_lookup(&key);
		if (!ct || !(ct->flags & CT_F_SNAT))
			return TC_PASS;
		e = *ct; /* nat_addr:nat_port is the client, addr:port the frontend */
		err = (addr_eq(p->daddr, in.saddr) && rewrite_icmp_outer(skb, p, 1, p->daddr, e.nat_addr)) ||
		      rewrite_quoted(skb, p, &in, 0, in.saddr, e.nat_addr, in.sport, e.nat_port) ||
		      rewrite_quoted(skb, p, &in, 1, in.daddr, e.addr, in.dport, e.port);
	}
	if (err) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(icmp_translated);
	return TC_PASS;
}

/*
 * Egress: an ICMP error toward a client about its packet to a local backend
 * (quoting client -> backend, as it was after the DNAT): from this node's
 * forwarding (fragmentation needed on the way to the pod), or from the
 * backend itself, whose address then leaves as the frontend's too.
 */
static __always_inline int icmp_egress(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key rkey = {};
	const struct ct_value *rev;
	struct ct_value from;
	struct pkt in = {};

	if (!parse_icmp_error(skb, p, &in))
		return TC_PASS;
	ct_key_of(&rkey, in.daddr, in.dport, in.saddr, in.sport, in.proto, CT_DIR_REPLY);
	rev = ct_lookup(&rkey);
	if (!rev || (rev->flags & CT_F_SNAT))
		return TC_PASS;
	from = *rev;
	if ((addr_eq(p->saddr, in.daddr) && rewrite_icmp_outer(skb, p, 0, p->saddr, from.addr)) ||
	    rewrite_quoted(skb, p, &in, 1, in.daddr, from.addr, in.dport, from.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(icmp_translated);
	return TC_PASS;
}

