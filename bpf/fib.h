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
 */
static __always_inline int backend_remote(struct __sk_buff *skb, const struct pkt *p,
					  const struct backend *be, __u32 snat[4])
{
	struct bpf_fib_lookup fib = {};
	struct tc_device *dev;
	long rc;

	fib_addrs(&fib, p, p->saddr, be->addr);
	fib.ifindex = skb->ingress_ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (rc >= 0) {
		if (rc != BPF_FIB_LKUP_RET_SUCCESS || !is_kpr_device(fib.ifindex))
			return 0; /* the kernel decides, after the DNAT */
		if (p->v6)
			__builtin_memcpy(snat, fib.ipv6_src, 16);
		else
			addr_from_v4(snat, fib.ipv4_src);
		return 1;
	}
	/* Before Linux 6.7 the kernel refuses those flags (-EINVAL): look the
	 * route up plainly, and SNAT to the node's address on the device it
	 * leaves through, as the loader recorded it. */
	__builtin_memset(&fib, 0, sizeof(fib));
	fib_addrs(&fib, p, p->saddr, be->addr);
	fib.ifindex = skb->ingress_ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return 0;
	dev = bpf_map_lookup_elem(&kpr_tc_devices, &fib.ifindex);
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
 * Send a translated packet (now src -> dst) on its way through a FIB lookup
 * and a redirect to the device it routes to. Whatever the lookup cannot
 * settle (fragmentation needed, no route, TTL expiring) goes to the
 * kernel's own forwarding, which sends the ICMP errors.
 */
static __always_inline int fib_redirect(struct __sk_buff *skb, const struct pkt *p,
					const __u32 src[4], const __u32 dst[4])
{
	struct bpf_fib_lookup fib = {};
	long rc;

	fib_addrs(&fib, p, src, dst);
	fib.ifindex = skb->ingress_ifindex;
	/* tot_len 0: the helper checks the skb against the egress MTU,
	 * GSO-aware. */
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_PASS;
	if (dec_ttl(skb, p))
		return TC_PASS;
	STAT_INC(redirected);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(fib.ifindex, 0);
}

