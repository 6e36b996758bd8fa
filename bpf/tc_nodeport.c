//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Packet-level Service translation at tc, for traffic from other machines:
 * a NodePort, ExternalIP or LoadBalancer IP reached from outside the node
 * never passes the socket hooks of sock_lb.c, so these programs, on the
 * node's external devices, do per packet what kube-proxy's PREROUTING and
 * POSTROUTING NAT rules do.
 *
 * kpr_tc_ingress looks a packet's destination up in kpr_services (the
 * external scope first, which exists for externalTrafficPolicy: Local, else
 * the internal one), picks a backend, records the flow in kpr's conntrack
 * (ct.h: kpr_ct_new, then kpr_conntrack once it shows traffic both ways) and
 * rewrites the destination (DNAT); the kernel then routes the packet to the
 * backend. kpr_tc_egress finds the backend's replies in the conntrack and
 * rewrites their source back to the frontend, so the client sees the
 * address it talked to.
 *
 * A backend on this node is reached through the node's routing: after the
 * DNAT the kernel routes the packet to the pod, and the reply comes back
 * through this node, where egress restores it. A backend on another node
 * (the route to it leaves through one of kpr's devices) gets the flow SNATed
 * to the node address that route leaves from, with a port of its own, and
 * the packet is sent out through a FIB lookup and a redirect; the backend's
 * reply arrives at ingress addressed to that port, is un-SNATed and
 * un-DNATed there, and is redirected to the client. externalTrafficPolicy:
 * Local (the external scope) never SNATs: its backends are all local, and
 * the pod sees the client's address. A local backend is not SNATed under
 * the Cluster policy either (as Cilium does, and unlike kube-proxy, which
 * masquerades it to the node): its reply passes this node anyway.
 *
 * This file parses packets and holds the two entry points, with the path
 * of a new flow that ties the concerns together; each concern has a header:
 * lb.h the backend pick (the same code as the socket hooks'), ct.h the
 * conntrack, nat.h the rewrites and the SNAT, fib.h the routing and the
 * redirect, icmp.h the ICMP errors about flows, pmtu.h those kpr sends
 * itself about a packet too big for its route, pkt.h the parsed packet
 * they all take.
 * The maps are those of maps.h, shared with the other objects.
 */
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
#include "lb.h"
#include "pkt.h"
#include "ct.h"
#include "fib.h"
#include "nat.h"
#include "icmp.h"
#include "pmtu.h"
#include "frag.h"

/* The size of every Maglev table in kpr_maglev (a prime), set by the
 * loader from --maglev-table-size. */
volatile const __u32 maglev_table_size = 16381;

/* The cluster's seed of the Maglev flow hash, set by the loader: the same
 * on every node (as the tables, which the control plane builds with it),
 * so that every node picks the same backend for a flow, and secret, so
 * that an outsider cannot. */
volatile const __u64 maglev_seed = 0;

/* svc_flags reaches BTF only through a use of its type: this constant is
 * that use, so that Go can check its copy of the values against this
 * object. Nothing reads it. */
volatile const enum svc_flags btf_svc_flags = SVC_F_SOURCE_RANGES;

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

/* The Service frontend a packet from outside is addressed to, if kpr serves
 * it from outside: the external scope where the Service has one, and never a
 * ClusterIP. */
static __always_inline const struct svc_value *frontend_lookup(const struct pkt *p,
							       struct svc_key *key)
{
	const struct svc_value *master;

	addr_copy(key->addr, p->daddr);
	key->port = p->dport;
	key->proto = p->proto;
	key->scope = SVC_SCOPE_EXTERNAL;
	key->slot = 0;
	master = bpf_map_lookup_elem(&kpr_services, key);
	if (!master) {
		key->scope = SVC_SCOPE_INTERNAL;
		master = bpf_map_lookup_elem(&kpr_services, key);
		if (!master)
			return NULL;
	}
	if (master->kind == SVC_KIND_CLUSTER_IP) {
		STAT_INC(cluster_ip_outside);
		return NULL;
	}
	return master;
}

/* Whether a new flow may reach the frontend key names: always, unless
 * the master restricts its sources (loadBalancerSourceRanges) and none of
 * its ranges in kpr_src_ranges holds the client. */
static __always_inline int source_allowed(const struct pkt *p, const struct svc_key *key,
					  const struct svc_value *master)
{
	struct src_range_key rkey = {};

	if (!(master->flags & SVC_F_SOURCE_RANGES))
		return 1;
	rkey.prefixlen = SRC_RANGE_FRONTEND_BITS + 128;
	addr_copy(rkey.frontend, key->addr);
	rkey.port = key->port;
	rkey.proto = key->proto;
	addr_copy(rkey.source, p->saddr);
	return bpf_map_lookup_elem(&kpr_src_ranges, &rkey) != NULL;
}

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
				     const struct svc_value *master, struct ct_value *fwd, __u64 now)
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
	/* externalTrafficPolicy: Local (the external scope) keeps the
	 * client's address. */
	if (skey->scope == SVC_SCOPE_INTERNAL && backend_remote(skb, p, be, fwd->nat_addr))
		fwd->flags |= CT_F_SNAT;
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

SEC("tc")
int kpr_tc_ingress(struct __sk_buff *skb)
{
	struct ct_key fkey = {};
	struct svc_key skey = {};
	struct ct_value *to;
	const struct svc_value *master;
	struct ct_value *ct;
	struct pkt p = {};
	__u32 room = CT_ROOM_FORWARD;
	__u64 now;
	int ret;

	ret = parse(skb, &p);
	if (ret == 0)
		return TC_PASS;
	/* A loopback destination from the wire is a martian the kernel drops
	 * after tc, so kpr must not translate it first: a loopback NodePort
	 * (--nodeport-addresses 127.0.0.1/8) is for the node's own sockets,
	 * not for a neighbour that addresses a frame to 127.0.0.1. */
	if (addr_loopback(p.daddr)) {
		STAT_INC(drop_loopback);
		return TC_ACT_SHOT;
	}
	if (ret == PARSED_ICMP)
		return icmp_ingress(skb, &p);
	if (snat_port(p.dport)) {
		ret = snat_reply(skb, &p);
		if (ret != -1)
			return ret;
	}

	ct_key_of(&fkey, p.saddr, p.sport, p.daddr, p.dport, p.proto, CT_DIR_FORWARD);

	to = bpf_map_lookup_elem(&kpr_tc_ct_room, &room);
	if (!to)
		return TC_PASS; /* never: a per-CPU array's entries always exist */
	now = bpf_ktime_get_ns();
	ct = ct_lookup(&fkey);
	if (ct && ct_usable(ct, &p, now)) {
		ret = ct_forward_seen(skb, ct, &p);
		if (ret < 0)
			return TC_ACT_SHOT; /* a RST or FIN outside the window */
		/* Copied first: ct_touch may move the entry (ct.h). */
		*to = *ct;
		ct_touch(ct, p.saddr, p.sport, p.proto, ret, now);
	} else {
		/* Not a flow kpr knows (or one that is over): only traffic to
		 * a frontend goes further, so nothing else ever depends on
		 * the conntrack map having room. */
		master = frontend_lookup(&p, &skey);
		if (!master)
			return TC_PASS;
		if (!source_allowed(&p, &skey, master)) {
			STAT_INC(drop_source_range);
			return TC_ACT_SHOT;
		}
		/* A later fragment follows the flow its first fragment
		 * opened, and opens none: that one was dropped, or its flow
		 * is already over, and a flow picked now could differ from
		 * the first fragment's (another SNAT port). */
		if (p.frag_later) {
			STAT_INC(drop_fragment);
			return TC_ACT_SHOT;
		}
		/* Only a plain SYN opens a TCP flow. A SYN with ACK, RST or
		 * FIN opens no connection (netfilter calls it INVALID) and is
		 * dropped: translated, it would hold entries and a SNAT port
		 * for nothing; passed on, the node would answer it with a
		 * reset, to a source that may be spoofed. Another segment
		 * belongs to a connection kpr never saw, such as one made
		 * through kube-proxy's NAT before kpr took over the node,
		 * which the kernel's conntrack still carries; a random pick
		 * would send it to a backend that answers with a reset. A
		 * Maglev frontend picks the flow's backend again instead: that
		 * is how a flow survives moving to another node behind an
		 * ECMP router. Its entries have the handshake lifetime until
		 * the backend answers (ct.h). */
		if (p.proto == IPPROTO_TCP && (p.tcp_flags & TCP_FLAG_SYN) && !tcp_plain_syn(p.tcp_flags)) {
			STAT_INC(drop_invalid_syn);
			return TC_ACT_SHOT;
		}
		if (p.proto == IPPROTO_TCP && !(p.tcp_flags & TCP_FLAG_SYN) && !lb_has_maglev(master, skey.scope)) {
			STAT_INC(midstream);
			return TC_PASS;
		}
		__builtin_memset(to, 0, sizeof(*to));
		if (ct_create(skb, &p, &fkey, &skey, master, to, now))
			return TC_ACT_SHOT;
	}
	if (to->flags & CT_F_SNAT)
		return snat_forward(skb, &p, to);
	if (dnat(skb, &p, to))
		return TC_ACT_SHOT;
	return TC_PASS; /* a local backend: the kernel routes it there */
}

/* Egress: a reply of a flow to a local backend (backend -> client) leaves
 * with the frontend's address and port as its source. */
SEC("tc")
int kpr_tc_egress(struct __sk_buff *skb)
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

char LICENSE[] SEC("license") = "Dual BSD/GPL";

