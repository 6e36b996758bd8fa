/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A flow through a frontend, as both tc objects make one: the node's
 * devices (tc_nodeport.c) for clients on other machines, the pods' devices
 * (tc_pod.c) for pods the socket hooks leave alone. The backend pick, the
 * conntrack entries of a new flow, the DNAT, the SNAT and its send, and the
 * reverse of a reply. What differs between the two is only when a flow is
 * SNATed (enum flow_origin).
 */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "lb.h"
#include "pkt.h"
#include "ct.h"
#include "fib.h"
#include "nat.h"
#include "icmp.h"
#include "pmtu.h"
#include "parse.h"

/* The size of every Maglev table in kpr_maglev (a prime), set by the
 * loader from --maglev-table-size. */
volatile const __u32 maglev_table_size = 16381;

/* The cluster's seed of the Maglev flow hash, set by the loader: the same
 * on every node (as the tables, which the control plane builds with it),
 * so that every node picks the same backend for a flow, and secret, so
 * that an outsider cannot. */
volatile const __u64 maglev_seed = 0;

/* Room for the conntrack entries a packet works on: the flow's forward
 * entry (a copy, or a new flow's) and a new flow's reply entry, which the
 * ingress program's stack has none left for (pmtu.h says why). One set per
 * CPU; not pinned: the programs hold it. */
enum { CT_ROOM_REPLY, CT_ROOM_FORWARD, CT_ROOM_N };
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_value);
	__uint(max_entries, CT_ROOM_N);
} kpr_tc_ct_room SEC(".maps");

/* Where a new flow's client is, which decides whether the flow is SNATed. */
enum flow_origin {
	/* Another machine, through a node's device: SNATed when its backend
	 * is on another node, so that the reply comes back through here. */
	FLOW_FROM_OUTSIDE,
	/* A pod on this node, through its own device: its address is routable
	 * to every backend, so only a hairpin (the pod reaches itself) is
	 * SNATed, to the frontend: a packet from its own address would be a
	 * martian to the pod. */
	FLOW_FROM_POD,
};

/*
 * A new flow to a frontend: pick a backend and store both conntrack
 * entries, the reply one first so that no forward entry exists without it.
 * On success (0) *fwd holds the forward entry; -1 (counted) drops the packet.
 * A flow whose entries cannot be stored is dropped rather than translated:
 * its replies could not be restored, and the client would reset them. Only
 * new flows to a frontend ever need an insert, so a full map never keeps a
 * packet from reaching the node itself.
 */
static __always_inline int ct_create(struct __sk_buff *skb, const struct pkt *p,
				     const struct ct_key *fkey, struct svc_key *skey,
				     const struct svc_value *master, struct ct_value *fwd, __u64 now,
				     enum flow_origin origin)
{
	struct ct_key rkey = {};
	struct ct_value *rev;
	struct tc_affinity_key client = {};
	const struct backend *be;
	__u32 backend_id, room = CT_ROOM_REPLY;
	int err;

	rev = bpf_map_lookup_elem(&kpr_tc_ct_room, &room);
	if (!rev)
		return -1; /* never: a per-CPU array's entry always exists */
	__builtin_memset(rev, 0, sizeof(*rev));
	if (master->count == 0) {
		STAT_INC(drop_no_backend);
		return -1;
	}
	be = NULL;
	if (master->affinity_timeout) {
		addr_copy(client.client, p->saddr);
		client.rev_nat_id = master->rev_nat_id;
		client.scope = skey->scope;
		backend_id = lb_affinity_lookup(&kpr_tc_affinity, &client, master, skey->scope, now);
		if (backend_id)
			be = bpf_map_lookup_elem(&kpr_backends, &backend_id);
		if (be)
			STAT_INC(affinity_hit);
	}
	/* ClientIP affinity wins; then the Maglev table, if the frontend has
	 * one and its backend is still there (flows take the slots meanwhile
	 * otherwise); then the backend slots. */
	if (!be) {
		backend_id = lb_maglev_backend(master, skey->scope, flow_hash(p, maglev_seed), maglev_table_size);
		if (backend_id)
			be = bpf_map_lookup_elem(&kpr_backends, &backend_id);
	}
	if (!be) {
		be = lb_pick_slot(skey, master, flow_hash(p, lb_node_seed()), &backend_id);
		if (!be) {
			STAT_INC(drop_no_backend);
			return -1;
		}
	}
	if (master->affinity_timeout)
		lb_affinity_update(&kpr_tc_affinity, &client, backend_id, now);

	addr_copy(fwd->addr, be->addr);
	fwd->port = be->port;
	fwd->backend_id = backend_id;
	fwd->rev_nat_id = master->rev_nat_id;
	fwd->flags = ct_seen(p, CT_DIR_FORWARD);
	if (p->proto == IPPROTO_TCP) {
		struct tcp_seg seg = {};

		tcp_seg_read(skb, p, &seg, 1);
		ct_win_open(fwd, p, &seg);
	}
	if (origin == FLOW_FROM_POD) {
		if (addr_eq(be->addr, p->saddr)) {
			addr_copy(fwd->nat_addr, p->daddr);
			fwd->flags |= CT_F_SNAT;
		}
	} else if (skey->scope == SVC_SCOPE_INTERNAL && backend_remote(skb, p, be, fwd->nat_addr)) {
		/* externalTrafficPolicy: Local (the external scope) keeps
		 * the client's address. */
		fwd->flags |= CT_F_SNAT;
	}
	fwd->expires_ns = now + ct_lifetime_ns(p->proto, fwd->flags);

	addr_copy(rev->addr, p->daddr);
	rev->port = p->dport;
	rev->backend_id = backend_id;
	rev->rev_nat_id = master->rev_nat_id;
	rev->expires_ns = fwd->expires_ns;
	rev->flags = fwd->flags & CT_F_SNAT;
	if (fwd->flags & CT_F_SNAT) {
		addr_copy(rev->nat_addr, p->saddr);
		rev->nat_port = p->sport;
		ct_reply_key(&rkey, fwd, p->saddr, p->sport, p->proto);
		if (snat_store(p, &rkey, rev, now)) {
			STAT_INC(drop_snat_ports);
			return -1;
		}
		fwd->nat_port = rkey.dport;
		STAT_INC(snat);
	} else {
		/* Without SNAT the reply entry's key is the backend and the
		 * client's address and port: another frontend's live flow
		 * from them to the same backend may hold it (ct_reply_free),
		 * and then this flow is refused. The backend could not tell
		 * the two apart either: they are one connection to it. */
		const struct ct_value *old;

		ct_reply_key(&rkey, fwd, p->saddr, p->sport, p->proto);
		old = ct_lookup(&rkey);

		if (old && !ct_reply_free(old, &rkey, p, now)) {
			STAT_INC(drop_reply_taken);
			return -1;
		}
		if (ct_store_new(&rkey, rev, BPF_ANY)) {
			STAT_INC(drop_ct_insert);
			return -1;
		}
	}
	err = ct_store_new(fkey, fwd, BPF_ANY);
	if (err) {
		ct_delete(&rkey);
		STAT_INC(drop_ct_insert);
		return -1;
	}
	STAT_INC(new_flows);
	return 0;
}

/* The DNAT of a packet to a frontend: to its flow's backend. Returns 0,
 * or -1 (counted) when the packet must be dropped. */
static __always_inline int dnat(struct __sk_buff *skb, const struct pkt *p, const struct ct_value *to)
{
	if (rewrite(skb, p, 1, p->daddr, to->addr, p->dport, to->port)) {
		STAT_INC(drop_rewrite);
		return -1;
	}
	STAT_INC(translated);
	return 0;
}

/*
 * A packet of a flow to a backend on another node, SNATed and sent on
 * through kpr's redirect. A local backend is reached through the kernel's
 * forwarding instead, which answers a packet too big for the pod's link
 * itself (icmp_egress translates its error); here kpr answers that, and
 * before the rewrite, so that the error quotes the packet as the client
 * sent it (pmtu.h).
 */
static __always_inline int snat_forward(struct __sk_buff *skb, const struct pkt *p, const struct ct_value *to)
{
	struct bpf_fib_lookup *fib = fib_room();
	long rc;
	int ret;

	if (!fib)
		return TC_ACT_SHOT; /* never: a per-CPU array's entry always exists */
	rc = fib_route(skb, p, to->nat_addr, to->addr, fib);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		ret = pmtu_too_big(skb, p, fib);
		if (ret != -1)
			return ret;
	}
	if (dnat(skb, p, to))
		return TC_ACT_SHOT;
	if (rewrite(skb, p, 0, p->saddr, to->nat_addr, p->sport, to->nat_port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	return fib_send(skb, p, rc, fib);
}

/* Egress toward the client: a reply of a flow that was not SNATed (backend
 * -> client) leaves with the frontend's address and port as its source.
 * The node's devices see those of local backends, a pod's device those of
 * every backend of the pod's own flows. */
static __always_inline int flow_reverse(struct __sk_buff *skb)
{
	struct ct_key rkey = {};
	struct ct_value *rev;
	struct ct_value from;
	struct pkt p = {};
	int ret;

	ret = parse(skb, &p);
	if (ret == PARSED_ICMP)
		return icmp_egress(skb, &p);
	if (ret != PARSED_L4)
		return TC_PASS;

	ct_key_of(&rkey, p.saddr, p.sport, p.daddr, p.dport, p.proto, CT_DIR_REPLY);
	rev = ct_lookup(&rkey);
	if (!rev || (rev->flags & CT_F_SNAT))
		return TC_PASS;
	/* A copy: the forward lookup below may evict the entry rev points to. */
	from = *rev;
	if (note_reply(skb, rev, &from, &p))
		return TC_ACT_SHOT; /* a RST or FIN outside the window */

	if (rewrite(skb, &p, 0, p.saddr, from.addr, p.sport, from.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(reversed);
	return TC_PASS;
}
