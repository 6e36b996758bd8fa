/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Address translation for the tc programs: the rewrite of an address and
 * port with its checksums (the DNAT of a flow and its reverse), and the
 * SNAT of a flow to a backend on another node: its port allocation, and
 * the reply that comes back to that port.
 */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/stddef.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "pkt.h"
#include "ct.h"
#include "fib.h"
#include "pmtu.h"

/*
 * The source ports SNATed flows get, host byte order, set by the loader.
 * A port is taken per backend address and port (the reply entry's key
 * holds both ends), so the range bounds only the flows to one backend
 * address and port through one node address: 1024-32767 gives each 31,744.
 * It stays below the kernel's default ephemeral range (32768-60999), where
 * the node's and the pods' own source ports come from, which MASQUERADE
 * keeps when it can (docs/tc-dataplane.md, SNAT ports and netfilter). A
 * local server listening on one of them does not matter: kpr's flows leave
 * from it, and their replies are taken at tc ingress before the kernel
 * sees them.
 */
volatile const __u16 snat_port_min = 1024;
volatile const __u16 snat_port_max = 32767;

/* How many ports a new SNATed flow tries before it takes one over. */
#define SNAT_TRIES 16

/*
 * Rewrite one address and port of the packet: the destination (dst != 0)
 * or the source. The IPv4 header checksum and the TCP or UDP checksum
 * (whose pseudo-header holds the address) are fixed incrementally; a UDP
 * checksum of 0 (none, IPv4 only) stays 0. A later fragment (frag.h) has
 * its address rewritten only: its ports and the checksum, which covers
 * the whole datagram, are in the first fragment, whose rewrite fixes them.
 * Returns 0 on success.
 */
static __always_inline int rewrite(struct __sk_buff *skb, const struct pkt *p, int dst,
				   const __u32 old_addr[4], const __u32 new_addr[4],
				   __u16 old_port, __u16 new_port)
{
	__u32 csum_off = p->l4_off + (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							      : offsetof(struct udphdr, check));
	__u32 port_off = p->l4_off + (dst ? 2 : 0);
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	int l4 = !p->frag_later;
	__u32 addr_off;
	__s64 diff;

	if (p->v6) {
		addr_off = p->l3_off + (dst ? offsetof(struct ipv6hdr, daddr)
					    : offsetof(struct ipv6hdr, saddr));
		if (l4) {
			diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
			if (diff < 0)
				return -1;
			if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | l4_flags))
				return -1;
		}
		if (bpf_skb_store_bytes(skb, addr_off, new_addr, 16, 0))
			return -1;
	} else {
		addr_off = p->l3_off + (dst ? offsetof(struct iphdr, daddr)
					    : offsetof(struct iphdr, saddr));
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check),
					old_addr[3], new_addr[3], 4))
			return -1;
		if (l4 && bpf_l4_csum_replace(skb, csum_off, old_addr[3], new_addr[3],
					      BPF_F_PSEUDO_HDR | l4_flags | 4))
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &new_addr[3], 4, 0))
			return -1;
	}
	if (l4 && old_port != new_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, new_port, l4_flags | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0))
			return -1;
	}
	return 0;
}

/*
 * Whether a new flow may take the SNAT port of the flow whose reply entry
 * is held: one that never showed traffic both ways (a SYN answered by a
 * SYN-ACK and nothing more, spoofed or slow), or one that is over (reset,
 * or closed by both sides) and only waits out its closing time.
 * netfilter's table drops such unassured entries first when it is full
 * (early drop), and its NAT reuses the tuple of a connection in CLOSE or
 * TIME_WAIT; an established, open flow keeps its port. Without the
 * second, a client that opens a connection per request holds a port per
 * request for ct_tcp_fin_s after each closes, and at a few hundred
 * requests a second new flows find no port (the hostile benchmark).
 *
 * A flow that has not completed its handshake keeps its port until its
 * last packet is SNAT_TAKEOVER_IDLE_NS old, a SYN retransmit's first
 * timeout: until then it may be a client's handshake in progress, which a
 * takeover would break (its SYN-ACK would go to the new flow's client).
 * Only a flood of more SYNs a second than the range has ports could then
 * hold every port tried; new flows, not live handshakes, wait for it.
 */
#define SNAT_TAKEOVER_IDLE_NS NSEC_PER_SEC

/* A flow that is over keeps its port for CT_CLOSED_IDLE_NS (ct.h says
 * why). */
static __always_inline int snat_reclaimable(const struct ct_value *held, __u8 proto, __u64 now)
{
	if (ct_closed(held->flags))
		return ct_idle(held, proto, now, CT_CLOSED_IDLE_NS);
	if (ct_assured(proto, held->flags))
		return 0;
	/* The client acknowledged the backend's answer: the three-way
	 * handshake is complete (netfilter's ESTABLISHED, assured), though
	 * the backend has sent no segment of its own yet. It may not speak
	 * first, or its accept queue may be full and drop that ACK for a
	 * while; the client already uses the connection. A spoofed SYN's flow
	 * never gets this far. */
	if (proto == IPPROTO_TCP && (held->flags & (CT_F_REPLIED | CT_F_ACK_FWD)) == (CT_F_REPLIED | CT_F_ACK_FWD))
		return 0;
	return ct_idle(held, proto, now, SNAT_TAKEOVER_IDLE_NS);
}

/*
 * Whether held, a reply entry under a port a new flow tries, is that of an
 * earlier flow with the new flow's own client address and port and
 * frontend: a connection that the client has ended (this is its new SYN,
 * and kpr found that flow over or forgot it), on the very ports the new one
 * would use. The new flow keeps the port, as netfilter re-opens a tuple in
 * CLOSE or TIME_WAIT with its NAT mapping. The backend sees the same
 * connection reopened, and nothing stale: if a half-open connection of an
 * earlier holder still sat there (a flood's, taken over), it answered the
 * client's first SYN with an ACK, the client's reset closed it, and the
 * SYN the client retransmits at once now gets through on this port, where
 * another port could meet another such remnant and cost the client a full
 * retransmission timeout.
 */
static __always_inline int snat_own_port(const struct ct_value *held, const struct pkt *p)
{
	return held->nat_port == p->sport && held->port == p->dport && addr_eq(held->nat_addr, p->saddr) &&
	       addr_eq(held->addr, p->daddr);
}

/* snat_victim_order of a holder whose port is free to take without a
 * takeover: it expired, or it is the new flow's own earlier flow. */
#define SNAT_FREE_ORDER 1

/*
 * Which held port a new flow takes, when every port it tried is held: the
 * lowest of these. A port whose holder expired, or was the new flow's own
 * earlier flow, first. Then a reclaimable holder (a takeover): a flow that
 * is over before one that never completed its handshake (which may still
 * be a slow client's), and within each the one idle longest, whose entry
 * expires first (every holder of a class has the same lifetime). 0 for a
 * holder that may keep its port.
 */
static __always_inline __u64 snat_victim_order(const struct ct_value *held, const struct pkt *p, __u64 now)
{
	if (now > held->expires_ns || snat_own_port(held, p))
		return SNAT_FREE_ORDER;
	if (!snat_reclaimable(held, p->proto, now))
		return 0;
	return held->expires_ns + (ct_closed(held->flags) ? 0 : (1ULL << 62));
}

/* The value of every claim: nothing reads it. A global rather than a
 * stack slot, since the ingress program's stack has no 8 bytes to spare on
 * Linux 5.10, whose verifier rounds each frame up to 32 bytes. */
static const __u32 snat_claimed = 1;

/*
 * Give the port in rkey->dport, held by a flow snat_victim_order picked,
 * to the new flow whose reply entry is rev. This CPU claims the port first
 * (kpr_snat_claims) and looks at the holder again under the claim: another
 * CPU may have just given the port to a flow of its own, which is not to be
 * taken, or the holder may have been established meanwhile. A holder taken
 * over loses its forward entry too, unless that has moved on to another
 * port: its next segment is then a new flow (or one of no flow kpr knows)
 * rather than sent out from a port that is no longer its own. The claim
 * keeps other takers out, not the holder's own packets, which write its
 * entry only in the few instructions between the last look and the store.
 * Returns 0 on success.
 */
static __always_inline int snat_take_over(const struct pkt *p, struct ct_key *rkey, const struct ct_value *rev,
					  __u64 now)
{
	struct ct_key fkey = {};
	const struct ct_value *old;
	const struct ct_value *fwd;
	__u64 order;
	long err;

	if (bpf_map_update_elem(&kpr_snat_claims, rkey, &snat_claimed, BPF_NOEXIST))
		return -1;
	old = ct_lookup(rkey);
	order = old ? snat_victim_order(old, p, now) : SNAT_FREE_ORDER;
	if (!order) {
		bpf_map_delete_elem(&kpr_snat_claims, rkey);
		return -1;
	}
	/* The holder's forward key is read before the store overwrites it (no
	 * copy of the entry: the ingress program's stack is near its limit). */
	if (order != SNAT_FREE_ORDER)
		ct_key_of(&fkey, old->nat_addr, old->nat_port, old->addr, old->port, rkey->proto, CT_DIR_FORWARD);
	/* A holder gone since the look (its LRU evicted it) leaves a free
	 * slot, which a CPU without a claim may fill: never overwritten. */
	err = ct_store_new(rkey, rev, old ? BPF_ANY : BPF_NOEXIST);
	bpf_map_delete_elem(&kpr_snat_claims, rkey);
	if (err)
		return -1;
	if (order == SNAT_FREE_ORDER)
		return 0;
	/* The forward key names the client and the frontend only: a client
	 * that reused its port for a new connection may have got the same
	 * port toward another backend, and that flow is not the holder's. */
	fwd = ct_lookup(&fkey);
	if (fwd && (fwd->flags & CT_F_SNAT) && fwd->nat_port == rkey->dport &&
	    addr_eq(fwd->nat_addr, rkey->daddr) && fwd->port == rkey->sport && addr_eq(fwd->addr, rkey->saddr))
		ct_delete(&fkey);
	STAT_INC(snat_takeover);
	return 0;
}

/*
 * Store the reply entry of a SNATed flow under a free port of the SNAT
 * range: the flow's hash picks where to start, and taken ports are skipped.
 * When a port's holder expired, or was the new flow's own earlier flow,
 * that port is taken; when SNAT_TRIES ports are all held, the port of the
 * first reclaimable holder in snat_victim_order is taken over, so that
 * half-open flows (a SYN flood, spoofed or not) never keep a backend from
 * new flows. The entry goes to kpr_ct_new, as the new flow's are (ct.h,
 * "Two maps"). Returns the port (network order) in rkey->dport, or -1 when
 * no holder of a port tried may give it up.
 */
static __always_inline int snat_store(const struct pkt *p, struct ct_key *rkey,
				      const struct ct_value *rev, __u64 now)
{
	__u32 range = (__u32)snat_port_max - snat_port_min + 1;
	__u32 start = flow_hash(p, lb_node_seed());
	__u64 victim_order = ~0ULL, order;
	__u16 victim = 0;
	const struct ct_value *old;
	int i;

	for (i = 0; i < SNAT_TRIES; i++) {
		rkey->dport = bpf_htons((__u16)(snat_port_min + (start + i) % range));
		old = ct_lookup(rkey);
		if (!old) {
			if (!bpf_map_update_elem(&kpr_ct_new, rkey, rev, BPF_NOEXIST))
				return 0;
			continue; /* taken meanwhile, from another CPU */
		}
		order = snat_victim_order(old, p, now);
		if (order && order < victim_order) {
			victim_order = order;
			victim = rkey->dport;
			if (order == SNAT_FREE_ORDER)
				break;
		}
	}
	if (!victim)
		return -1;
	rkey->dport = victim;
	return snat_take_over(p, rkey, rev, now);
}

static __always_inline int snat_port(__u16 port)
{
	__u16 h = bpf_ntohs(port);

	return h >= snat_port_min && h <= snat_port_max;
}

/* Ingress: a reply of a SNATed flow, from the backend on another node to
 * the node address and port the flow was given. Returns -1 when the packet
 * is no such reply. */
static __always_inline int snat_reply(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup *fib = fib_room();
	struct ct_key rkey = {};
	struct ct_value *rev;
	struct ct_value from;
	long rc;
	int ret;

	if (!fib)
		return -1; /* never: a per-CPU array's entry always exists */
	ct_key_of(&rkey, p->saddr, p->sport, p->daddr, p->dport, p->proto, CT_DIR_REPLY);
	rev = ct_lookup(&rkey);
	if (!rev || !(rev->flags & CT_F_SNAT))
		return -1;
	from = *rev;
	if (note_reply(skb, rev, &from, p))
		return TC_ACT_SHOT; /* a RST or FIN outside the window */
	/* A reply too big for the client's route is answered to the backend
	 * (pmtu.h), as the backend sent it. */
	rc = fib_route(skb, p, from.addr, from.nat_addr, fib);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		ret = pmtu_too_big(skb, p, fib);
		if (ret != -1)
			return ret;
	}
	/* To the client, from the frontend. */
	if (rewrite(skb, p, 1, p->daddr, from.nat_addr, p->dport, from.nat_port) ||
	    rewrite(skb, p, 0, p->saddr, from.addr, p->sport, from.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(reversed);
	return fib_send(skb, p, rc, fib);
}

