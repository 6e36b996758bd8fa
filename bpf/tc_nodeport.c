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
#include "parse.h"
#include "flow.h"

/* svc_flags reaches BTF only through a use of its type: this constant is
 * that use, so that Go can check its copy of the values against this
 * object. Nothing reads it. */
volatile const enum svc_flags btf_svc_flags = SVC_F_SOURCE_RANGES;

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
		if (ct_create(skb, &p, &fkey, &skey, master, to, now, FLOW_FROM_OUTSIDE))
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
	return flow_reverse(skb);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";

