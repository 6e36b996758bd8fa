/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * IP fragments and IPv6 extension headers, for parse() in tc_nodeport.c:
 * where a packet's TCP or UDP ports are when they are not right behind
 * the IP header.
 *
 * A fragmented datagram carries its ports in its first fragment only.
 * netfilter reassembles the datagram before it translates it; a tc program
 * cannot hold packets, so kpr translates each fragment on its own, as its
 * first fragment was: the first fragment's ports are recorded in
 * kpr_frags under the datagram's identity (addresses, id, protocol), and a
 * later fragment takes them from there. Only the first fragment holds the
 * L4 checksum, which covers the whole datagram: a later fragment has only
 * its addresses rewritten (pkt.frag_later, rewrite() in nat.h).
 *
 * A later fragment whose first fragment has not passed (the network
 * reordered them, or the entry was evicted) is passed untranslated and
 * counted (nat_stats.fragment), not dropped: kpr cannot tell it from a
 * fragment to the node itself, which the kernel reassembles whatever the
 * order. A Service's fragment passed so goes to a reassembly queue that
 * never completes (its first fragment was translated), and the datagram is
 * lost, as with a drop (docs/tc-dataplane.md, Fragments).
 */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "pkt.h"

/* struct pkt.frag, and what parse_ipv6_ext() found. */
#define FRAG_NONE 0
#define FRAG_FIRST 1	/* the first fragment: it carries the ports */
#define FRAG_LATER 2	/* a later fragment: no L4 header */

/* IPv4 frag_off: more fragments, and the offset (in 8-byte units). */
#define IPV4_MF 0x2000
#define IPV4_OFFSET 0x1fff

/* The IPv6 fragment header (RFC 8200 4.5); linux/ipv6.h has none. */
struct ipv6_frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;	/* offset << 3 | M */
	__be32 id;
};

#define IPV6_FRAG_OFFSET 0xfff8
#define IPV6_FRAG_MF 0x0001

/* How many extension headers kpr follows before TCP or UDP: the usual
 * chain of RFC 8200 4.1 (hop-by-hop, destination options, routing,
 * fragment, destination options) and one more. A longer chain is counted
 * and passed. */
#define IPV6_EXT_MAX 6

/* What parse_ipv6_ext() returns besides an upper-layer protocol. */
#define IPV6_EXT_OTHER 0	/* a protocol kpr does not translate */
#define IPV6_EXT_UNPARSED -1	/* a header kpr does not follow (counted) */

/* Whether nexthdr is one of the IPv6 extension headers (IANA's list)
 * that kpr does not follow: behind it may be TCP or UDP that kpr misses,
 * which is worth a count, unlike any other protocol. */
static __always_inline int ipv6_ext_unfollowed(__u8 nexthdr)
{
	switch (nexthdr) {
	case IPPROTO_AH:
	case 135:	/* Mobility */
	case 139:	/* HIP */
	case 140:	/* Shim6 */
	case 253:	/* experiments */
	case 254:
		return 1;
	}
	return 0;
}

/*
 * Walk the extension headers of the IPv6 packet whose first next header is
 * nexthdr, from off (just past the IPv6 header). Returns the upper-layer
 * protocol (TCP, UDP or ICMPv6), with p->l4_off where its header starts;
 * for a fragmented datagram, *frag says which fragment this is and fk
 * holds its id and protocol; a later fragment returns the fragment header's
 * next header, with p->l4_off past it. Hop-by-hop options, destination
 * options and a routing header whose segments are all visited (so that the
 * destination address is the final one) are skipped.
 */
static __always_inline int parse_ipv6_ext(struct __sk_buff *skb, struct pkt *p, __u8 nexthdr,
					  __u32 off, struct frag_key *fk, __u8 *frag)
{
	int i;

	for (i = 0; i < IPV6_EXT_MAX; i++) {
		switch (nexthdr) {
		case IPPROTO_TCP:
		case IPPROTO_UDP:
		case IPPROTO_ICMPV6:
			p->l4_off = off;
			return nexthdr;
		case IPPROTO_HOPOPTS:
		case IPPROTO_DSTOPTS:
		case IPPROTO_ROUTING: {
			__u8 h[4]; /* next header, length, routing type, segments left */

			if (bpf_skb_load_bytes(skb, off, h, sizeof(h)))
				return IPV6_EXT_UNPARSED;
			/* Segments left: the destination address is the next
			 * hop of a source route, not where the flow goes. */
			if (nexthdr == IPPROTO_ROUTING && h[3] != 0)
				return IPV6_EXT_UNPARSED;
			nexthdr = h[0];
			off += ((__u32)h[1] + 1) * 8;
			break;
		}
		case IPPROTO_FRAGMENT: {
			struct ipv6_frag_hdr fh;

			if (*frag != FRAG_NONE || bpf_skb_load_bytes(skb, off, &fh, sizeof(fh)))
				return IPV6_EXT_UNPARSED;
			off += sizeof(fh);
			/* An atomic fragment (offset 0, no more) is a whole
			 * datagram. */
			if (!(fh.frag_off & bpf_htons(IPV6_FRAG_OFFSET | IPV6_FRAG_MF))) {
				nexthdr = fh.nexthdr;
				break;
			}
			fk->id = fh.id;
			fk->proto = fh.nexthdr;
			if (fh.frag_off & bpf_htons(IPV6_FRAG_OFFSET)) {
				*frag = FRAG_LATER;
				p->l4_off = off;
				return fh.nexthdr;
			}
			*frag = FRAG_FIRST;
			nexthdr = fh.nexthdr;
			break;
		}
		default:
			return ipv6_ext_unfollowed(nexthdr) ? IPV6_EXT_UNPARSED : IPV6_EXT_OTHER;
		}
	}
	return IPV6_EXT_UNPARSED;
}

/* The first fragment of a datagram: its ports (and TCP flags) in p, for
 * the later fragments. An entry that cannot be stored shows up as the
 * later fragments' count. */
static __always_inline void frag_record(const struct frag_key *fk, const struct pkt *p)
{
	struct frag_value v = {
		.sport = p->sport,
		.dport = p->dport,
		.proto = p->proto,
		.tcp_flags = p->tcp_flags,
	};

	bpf_map_update_elem(&kpr_frags, fk, &v, BPF_ANY);
}

/* A later fragment: takes the ports of its first fragment. Returns 0
 * (counted) when that has not passed. */
static __always_inline int frag_follow(const struct frag_key *fk, struct pkt *p)
{
	const struct frag_value *v = bpf_map_lookup_elem(&kpr_frags, fk);

	if (!v) {
		STAT_INC(fragment);
		return 0;
	}
	p->sport = v->sport;
	p->dport = v->dport;
	p->proto = v->proto;
	p->tcp_flags = v->tcp_flags;
	p->frag_later = 1;
	return 1;
}
