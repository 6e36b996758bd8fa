/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Path MTU discovery for the packets the tc programs send on themselves (a
 * flow SNATed to a backend on another node, and its replies): when such a
 * packet does not fit the device its route leaves through, its sender gets
 * "fragmentation needed" (IPv4) or "packet too big" (IPv6) from kpr, as it
 * would from a router. The kernel cannot send it: after the SNAT the packet
 * carries the node's own address as its source, and the kernel drops it as
 * a martian before its forwarding ever checks the MTU.
 *
 * The packet is answered about before it is rewritten, so the error quotes
 * it as its sender sent it (its addresses and ports, which the sender's
 * socket is found by), and it leaves through the device it came in on,
 * back to the hop it came from. Rare: the sender lowers its path MTU after
 * the first error.
 *
 * The same in-place error, port unreachable, is how the pods' programs
 * refuse a UDP flow to a Service without endpoints (reject.h).
 */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/stddef.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "pkt.h"
#include "fib.h"
#include "icmp.h"

#define ICMP_FRAG_NEEDED 4
/* IPv6 needs every link to carry this much (RFC 8200): a smaller MTU is
 * never announced. */
#define PMTU_IPV6_MIN_MTU 1280
/* What an error quotes: the IP header (IPv4 with the longest options) and
 * the first 8 bytes of TCP or UDP, which hold the ports and, for TCP, the
 * sequence number the sender checks. */
#define PMTU_QUOTE_MAX (60 + 8)
#define PMTU_TTL 64

/* The ICMP and ICMPv6 header of an error: rest is unused but for the MTU,
 * which IPv4 has in its low 16 bits and IPv6 in all 32. */
struct pmtu_icmp {
	__u8 type;
	__u8 code;
	__u16 csum;
	__u32 rest;
};

/* The ICMPv6 checksum's pseudo-header (RFC 8200, 8.1). */
struct pmtu_pseudo6 {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 len;
	__u32 next;
};

/* What building an error needs, too much for the stack of the programs
 * that call pmtu_too_big: one per CPU. Not pinned: the programs hold it,
 * and nothing outlives the packet being answered. */
struct pmtu_scratch {
	__u8 quote[PMTU_QUOTE_MAX];
	__u32 l3[10];	/* the new IP header: IPv4's 20 bytes, or IPv6's 40 */
	struct pmtu_pseudo6 ph;
	struct pmtu_icmp icmp;
	__u8 macs[2 * ETH_ALEN];
	__u32 mtu;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct pmtu_scratch);
	__uint(max_entries, 1);
} kpr_tc_pmtu_scratch SEC(".maps");

static __always_inline __u16 pmtu_csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/*
 * The part of the error both families share: the ICMP checksum (sum holds
 * what the IP header adds to it: IPv6's pseudo-header, nothing for IPv4),
 * and the packet, cut to the error's length and rewritten. l3len and qlen
 * are the lengths of the new IP header in b->l3 and of the quote. Returns
 * 0 on success; on failure the packet may be half rewritten, and must be
 * dropped.
 */
static __always_inline int pmtu_emit(struct __sk_buff *skb, struct pmtu_scratch *b, __s64 sum,
				     __u32 l3len, __u32 qlen)
{
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&b->icmp, sizeof(b->icmp), sum);
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)b->quote, qlen, sum);
	if (sum < 0)
		return -1;
	b->icmp.csum = pmtu_csum_fold(sum);
	/* The trim drops what GSO state the packet had: the error is one
	 * small packet. */
	if (bpf_skb_change_tail(skb, ETH_HLEN + l3len + sizeof(b->icmp) + qlen, 0))
		return -1;
	if (bpf_skb_store_bytes(skb, 0, &b->macs[ETH_ALEN], ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, b->macs, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, b->l3, l3len, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + l3len, &b->icmp, sizeof(b->icmp), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + l3len + sizeof(b->icmp), b->quote, qlen, 0))
		return -1;
	return 0;
}

/* The errors kpr sends: about a packet too big for its route, or, to a
 * pod, about a new UDP flow whose frontend has no backend (reject.h). */
enum icmp_error_kind { ICMP_ERR_TOO_BIG, ICMP_ERR_PORT_UNREACH };

#define ICMP_PORT_UNREACH 3
#define ICMPV6_PORT_UNREACH 4

/* A new IPv4 header in ip, from the packet's destination back to its
 * sender, carrying len bytes of proto, with its checksum: the header of
 * every answer kpr makes of a packet in place. Returns 0, or -1. */
static __always_inline int pmtu_ip4_back(struct iphdr *ip, const struct pkt *p, __u8 proto, __u16 len)
{
	__s64 sum;

	ip->version = 4;
	ip->ihl = 5;
	ip->tot_len = bpf_htons(sizeof(*ip) + len);
	ip->ttl = PMTU_TTL;
	ip->protocol = proto;
	ip->saddr = p->daddr[3];
	ip->daddr = p->saddr[3];
	sum = bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0);
	if (sum < 0)
		return -1;
	ip->check = pmtu_csum_fold(sum);
	return 0;
}

/* IPv4: fragmentation needed or port unreachable, quoting the IP header
 * with its options. */
static __always_inline int pmtu_error4(struct __sk_buff *skb, const struct pkt *p,
				       struct pmtu_scratch *b, enum icmp_error_kind kind)
{
	struct iphdr *ip = (void *)b->l3;
	__u32 qlen = (b->quote[0] & 0xf) * 4 + 8; /* ihl >= 5: parse() checked */

	if (pmtu_ip4_back(ip, p, IPPROTO_ICMP, sizeof(b->icmp) + qlen))
		return -1;
	b->icmp.type = ICMP_DEST_UNREACH;
	if (kind == ICMP_ERR_PORT_UNREACH) {
		b->icmp.code = ICMP_PORT_UNREACH;
	} else {
		b->icmp.code = ICMP_FRAG_NEEDED;
		b->icmp.rest = bpf_htonl(b->mtu & 0xffff);
	}
	return pmtu_emit(skb, b, 0, sizeof(*ip), qlen);
}

/* IPv6: packet too big or port unreachable, quoting the IPv6 header. */
static __always_inline int pmtu_error6(struct __sk_buff *skb, const struct pkt *p,
				       struct pmtu_scratch *b, enum icmp_error_kind kind)
{
	struct ipv6hdr *ip6 = (void *)b->l3;
	const __u32 qlen = sizeof(struct ipv6hdr) + 8;

	ip6->version = 6;
	ip6->payload_len = bpf_htons(sizeof(b->icmp) + qlen);
	ip6->nexthdr = IPPROTO_ICMPV6;
	ip6->hop_limit = PMTU_TTL;
	__builtin_memcpy(&ip6->saddr, p->daddr, 16);
	__builtin_memcpy(&ip6->daddr, p->saddr, 16);
	if (kind == ICMP_ERR_PORT_UNREACH) {
		b->icmp.type = ICMPV6_DEST_UNREACH;
		b->icmp.code = ICMPV6_PORT_UNREACH;
	} else {
		b->icmp.type = ICMPV6_PKT_TOOBIG;
		b->icmp.rest = bpf_htonl(b->mtu < PMTU_IPV6_MIN_MTU ? PMTU_IPV6_MIN_MTU : b->mtu);
	}
	addr_copy(b->ph.saddr, p->daddr);
	addr_copy(b->ph.daddr, p->saddr);
	b->ph.len = bpf_htonl(sizeof(b->icmp) + qlen);
	b->ph.next = bpf_htonl(IPPROTO_ICMPV6);
	return pmtu_emit(skb, b, bpf_csum_diff(NULL, 0, (__be32 *)&b->ph, sizeof(b->ph), 0),
			 sizeof(*ip6), qlen);
}

/*
 * Turn the packet in place into an ICMP error about it (the path's MTU, or
 * port unreachable): from the address it was sent to, to its sender,
 * with the Ethernet addresses swapped (parse() took the IP header to be at
 * ETH_HLEN). Returns 0 on success; on failure the packet may be half
 * rewritten, and must be dropped.
 */
static __always_inline int pmtu_make_error(struct __sk_buff *skb, const struct pkt *p,
					   struct pmtu_scratch *b, enum icmp_error_kind kind)
{
	__builtin_memset(b->l3, 0, sizeof(b->l3));
	__builtin_memset(&b->icmp, 0, sizeof(b->icmp));
	__builtin_memset(b->quote, 0, sizeof(b->quote));
	if (bpf_skb_load_bytes(skb, 0, b->macs, sizeof(b->macs)))
		return -1;
	/* A packet may be shorter than the longest quote: a SYN with a plain
	 * IPv4 header is 60 bytes of IP. Fixed lengths, longest first, keep
	 * the verifier's view simple: an IPv6 quote is 48 bytes, an IPv4 one
	 * 28 plus the header's options, and a packet that parse() let through
	 * has at least that much but for a truncated one, whose missing bytes
	 * are quoted as zeros. */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, b->quote, sizeof(b->quote)) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN, b->quote, sizeof(struct ipv6hdr) + 8) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN, b->quote, sizeof(struct iphdr) + 8))
		return -1;
	return p->v6 ? pmtu_error6(skb, p, b, kind) : pmtu_error4(skb, p, b, kind);
}

/*
 * A packet that fib_route (whose result is fib) found too big for its route, not yet rewritten.
 * Returns the verdict when the packet became the ICMP error to its sender
 * (or was dropped), or -1 when it goes on untouched.
 *
 * An IPv4 packet without DF is answered too. A router would fragment it,
 * but a tc program cannot, and the kernel, handed the packet after the
 * SNAT, drops it as a martian. Such packets are common: the fragments of a
 * datagram larger than the client's own link carry no DF. Linux takes the
 * error's MTU for the route whatever the packet's DF (the first fragment
 * quotes the ports its socket is found by), and fragments what it sends
 * next to fit; the packet answered is lost, as any packet that meets a
 * smaller MTU first is.
 *
 * Out of line, with its buffers in kpr_tc_pmtu_scratch: the programs that
 * call it use most of the 512-byte stack, which a call's frame shares.
 */
static volatile const __u32 pmtu_scratch_key = 0;

static __noinline int pmtu_too_big(struct __sk_buff *skb, const struct pkt *p,
				   struct bpf_fib_lookup *fib)
{
	struct pmtu_scratch *b;

	/* The key lives in .rodata, not in this frame: every byte of the
	 * frame counts against the caller's (see above). */
	b = bpf_map_lookup_elem(&kpr_tc_pmtu_scratch, (const void *)&pmtu_scratch_key);
	if (!b)
		return -1;
	/* Linux 5.12 and later return the device's MTU with the verdict. */
	b->mtu = fib->mtu_result;
	if (!b->mtu)
		fib_mtu(skb, fib, &b->mtu);
	if (!b->mtu)
		return -1;
	if (pmtu_make_error(skb, p, b, ICMP_ERR_TOO_BIG)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(icmp_too_big);
	return bpf_redirect(skb->ingress_ifindex, 0);
}

