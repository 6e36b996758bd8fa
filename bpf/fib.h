/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Routing for the tc programs: whether a backend is on another node (the
 * FIB lookup's device is one of kpr's), and the redirect that sends a
 * translated packet on its way, with the TTL decrement the kernel's
 * forwarding would have done.
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
#include "addr.h"
#include "pkt.h"

/* The devices kpr's tc programs are attached to, by ifindex, with the
 * node's addresses on them, written by the loader: a backend whose route
 * leaves through one of them is on another node. Not pinned: the programs
 * hold it, and a new kpr loads its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct tc_device);
	__uint(max_entries, 256);
} kpr_tc_devices SEC(".maps");

/* Whether ifindex is one of the devices kpr's programs are on. */
static __always_inline int is_kpr_device(__u32 ifindex)
{
	return bpf_map_lookup_elem(&kpr_tc_devices, &ifindex) != NULL;
}

/* Room for a route lookup, which the programs' stack has none left for
 * (pmtu.h says why). One per CPU; not pinned: the programs hold it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct bpf_fib_lookup);
	__uint(max_entries, 1);
} kpr_tc_fib SEC(".maps");

static __always_inline struct bpf_fib_lookup *fib_room(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&kpr_tc_fib, &zero);
}

static __always_inline void fib_addrs(struct bpf_fib_lookup *fib, const struct pkt *p,
				      const __u32 src[4], const __u32 dst[4])
{
	if (p->v6) {
		fib->family = AF_INET6;
		__builtin_memcpy(fib->ipv6_src, src, 16);
		__builtin_memcpy(fib->ipv6_dst, dst, 16);
	} else {
		fib->family = AF_INET;
		fib->ipv4_src = src[3];
		fib->ipv4_dst = dst[3];
	}
	fib->l4_protocol = p->proto;
}

/*
 * Whether the route to a backend leaves through one of kpr's devices, which
 * makes it a backend on another node; if so, *snat is the address the node
 * sends from on that route.
 *
 * A packet too big for that route still has it: with tot_len 0 the helper
 * resolves the route first and checks the skb against the device after
 * (ifindex and source set, verdict FRAG_NEEDED). Were that taken as "not
 * remote", a flow whose first packet does not fit (a UDP datagram's first
 * fragment) would go unSNATed to the kernel, and its backend would answer
 * the client straight from its own address.
 */
static __always_inline int backend_remote(struct __sk_buff *skb, const struct pkt *p,
					  const struct backend *be, __u32 snat[4])
{
	struct bpf_fib_lookup *fib = fib_room();
	struct tc_device *dev;
	long rc;

	if (!fib)
		return 0; /* never: a per-CPU array's entry always exists */
	__builtin_memset(fib, 0, sizeof(*fib));
	fib_addrs(fib, p, p->saddr, be->addr);
	fib->ifindex = skb->ingress_ifindex;
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (rc >= 0) {
		if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED) ||
		    !is_kpr_device(fib->ifindex))
			return 0; /* the kernel decides, after the DNAT */
		if (p->v6)
			__builtin_memcpy(snat, fib->ipv6_src, 16);
		else
			addr_from_v4(snat, fib->ipv4_src);
		return 1;
	}
	/* Before Linux 6.7 the kernel refuses those flags (-EINVAL): look the
	 * route up plainly, and SNAT to the node's address on the device it
	 * leaves through, as the loader recorded it. */
	__builtin_memset(fib, 0, sizeof(*fib));
	fib_addrs(fib, p, p->saddr, be->addr);
	fib->ifindex = skb->ingress_ifindex;
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return 0;
	dev = bpf_map_lookup_elem(&kpr_tc_devices, &fib->ifindex);
	if (!dev)
		return 0;
	addr_copy(snat, p->v6 ? dev->addr6 : dev->addr4);
	return snat[0] | snat[1] | snat[2] | snat[3] ? 1 : 0;
}

/* A redirect skips the kernel's forwarding, so it decrements the TTL (hop
 * limit) itself. Returns -1 when the packet must not go on (TTL 1: the
 * kernel then sends the ICMP error). */
static __always_inline int dec_ttl(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 off = p->l3_off + (p->v6 ? offsetof(struct ipv6hdr, hop_limit) : offsetof(struct iphdr, ttl));
	__u8 ttl;

	if (bpf_skb_load_bytes(skb, off, &ttl, 1) || ttl <= 1)
		return -1;
	/* IPv4: the TTL is the high byte of a 16-bit word of the header. */
	if (!p->v6 && bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check),
					  bpf_htons((__u16)ttl << 8), bpf_htons((__u16)(ttl - 1) << 8), 2))
		return -1;
	ttl--;
	return bpf_skb_store_bytes(skb, off, &ttl, 1, 0) ? -1 : 0;
}

/*
 * The L3 length of the segments of a GSO packet (TCP or UDP), which is
 * what must fit a route, or 0 for a packet that is not GSO. The kernel's
 * own check of a redirected skb (is_skb_forwardable) lets every GSO packet
 * pass, whatever its segments: a device that segments it then sends them
 * too big. Linux 5.7 gave __sk_buff gso_size.
 */
static __always_inline __u32 fib_gso_seglen(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 gso_size = skb->gso_size;
	__u8 doff = 0;

	if (!gso_size)
		return 0;
	if (p->proto != IPPROTO_TCP)
		return p->l4_off - p->l3_off + 8 + gso_size;
	if (bpf_skb_load_bytes(skb, p->l4_off + 12, &doff, 1))
		return 0;
	return p->l4_off - p->l3_off + (doff >> 4) * 4 + gso_size;
}

/*
 * The route of a packet once it is translated to src -> dst, looked up
 * before it is rewritten: a packet that does not fit the route is answered
 * about as its sender sent it (pmtu.h). A packet that is not GSO is looked
 * up with tot_len 0: the helper checks the skb against the egress device's
 * MTU, and from Linux 5.12 returns that MTU in mtu_result. A GSO packet is
 * looked up with the length of its segments, checked against the route's
 * MTU. (Giving a packet that is not GSO its own length instead, so that a
 * locked route MTU counted as in the kernel's forwarding, broke path MTU
 * discovery on Linux 5.10, whose helper then no longer found packets too
 * big for the device.)
 */
static __always_inline long fib_route(struct __sk_buff *skb, const struct pkt *p,
				      const __u32 src[4], const __u32 dst[4], struct bpf_fib_lookup *fib)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib_addrs(fib, p, src, dst);
	fib->ifindex = skb->ingress_ifindex;
	fib->tot_len = fib_gso_seglen(skb, p);
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/*
 * The MTU of the route fib_route found (fib, which it overwrites), for a
 * kernel whose lookup does not return it (before 5.12): the largest L3
 * length the lookup, given it as tot_len, does not call too big, found bit
 * by bit into *mtu. The lookup's inputs but the device are still in fib.
 * Only a packet that does not fit pays for it; *mtu stays 0 when no length
 * fits. *mtu must be map memory: there the verifier tracks no value, so
 * that the 16 lookups verify as one path each rather than 2^16 of them.
 */
static __always_inline void fib_mtu(struct __sk_buff *skb, struct bpf_fib_lookup *fib, __u32 *mtu)
{
	__u32 bit;
	int i;

	*mtu = 0;
	for (i = 15; i >= 0; i--) {
		bit = 1U << i;
		fib->ifindex = skb->ingress_ifindex;
		fib->tot_len = *mtu | bit;
		if (bpf_fib_lookup(skb, fib, sizeof(*fib), 0) != BPF_FIB_LKUP_RET_FRAG_NEEDED)
			*mtu |= bit;
	}
}

/*
 * Send a translated packet on its way, to where fib_route (verdict rc)
 * said, through a redirect. Whatever the lookup cannot settle (no route,
 * TTL expiring, and a packet too big that pmtu.h did not answer) goes to
 * the kernel's own forwarding, which sends the ICMP errors it can.
 */
static __always_inline int fib_send(struct __sk_buff *skb, const struct pkt *p, long rc,
				    const struct bpf_fib_lookup *fib)
{
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_PASS;
	if (dec_ttl(skb, p))
		return TC_PASS;
	STAT_INC(redirected);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib->ifindex, NULL, 0, 0);
	if (bpf_skb_store_bytes(skb, 0, fib->dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, fib->smac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(fib->ifindex, 0);
}
