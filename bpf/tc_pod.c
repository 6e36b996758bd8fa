//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Packet-level Service translation at tc for the pods the socket hooks of
 * sock_lb.c leave alone (--socket-lb per-pod or host-only): a VM's or a
 * sandbox's guest, whose sockets are not the node's, and a pod with a
 * service-mesh sidecar, whose redirect must see the ClusterIP. Their
 * packets reach the node already addressed to the frontend.
 *
 * The programs sit on each such pod's host-side device (the node's end of
 * its veth): ingress sees every packet the pod sends, egress every packet
 * it receives. Not on a bridge: a same-node backend's reply is switched
 * from port to port and never passes the bridge device, which is why
 * kube-proxy needs br_netfilter there.
 *
 * kpr_pod_ingress translates a pod's packet to a frontend as the socket
 * hooks would: the internal scope of kpr_services (internalTrafficPolicy,
 * topology, terminating endpoints are all in it), every kind of frontend,
 * ClusterIPs included, and ClientIP affinity. The flow goes into kpr's
 * conntrack with the NodePort path's protections (flow.h, ct.h). A pod's
 * address is routable to every backend, so after the DNAT the kernel routes
 * the packet; only a hairpin (the pod reaches itself) is SNATed, to the
 * frontend, and sent back through a redirect. kpr_pod_egress restores the
 * replies. A new flow to a frontend without a backend is refused at once
 * (reject.h), as kube-proxy's REJECT rule refuses it.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "pkt.h"
#include "ct.h"
#include "nat.h"
#include "icmp.h"
#include "pmtu.h"
#include "reject.h"
#include "parse.h"
#include "flow.h"

/* The frontend a pod's packet is addressed to, as the socket hooks look it
 * up: the internal scope, any kind. A loopback address is the pod's own,
 * never a Service (sock_lb.c, frontend_visible), and never reaches here. */
static __always_inline const struct svc_value *pod_frontend(const struct pkt *p, struct svc_key *key)
{
	addr_copy(key->addr, p->daddr);
	key->port = p->dport;
	key->proto = p->proto;
	key->scope = SVC_SCOPE_INTERNAL;
	key->slot = 0;
	return bpf_map_lookup_elem(&kpr_services, key);
}

SEC("tc")
int kpr_pod_ingress(struct __sk_buff *skb)
{
	struct ct_key fkey = {};
	struct svc_key skey = {};
	const struct svc_value *master;
	struct ct_value *to;
	struct ct_value *ct;
	struct pkt p = {};
	__u32 room = CT_ROOM_FORWARD;
	__u64 now;
	int ret;

	ret = parse(skb, &p);
	if (ret == 0)
		return TC_PASS;
	if (ret == PARSED_ICMP)
		return icmp_ingress(skb, &p);
	/* The pod's answer to a hairpin flow, which came to it from the
	 * frontend and a SNAT port. */
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
		*to = *ct; /* copied first: ct_touch may move the entry */
		ct_touch(ct, p.saddr, p.sport, p.proto, ret, now);
	} else {
		master = pod_frontend(&p, &skey);
		if (!master)
			return TC_PASS;
		/* As on the node's devices (tc_nodeport.c says why): a later
		 * fragment opens no flow, nor does a SYN with other flags, and
		 * another segment of a connection kpr never saw (one made
		 * through kube-proxy's NAT before kpr took over, which the
		 * kernel's conntrack still carries) goes on untouched. */
		if (p.frag_later) {
			STAT_INC(drop_fragment);
			return TC_ACT_SHOT;
		}
		if (p.proto == IPPROTO_TCP && (p.tcp_flags & TCP_FLAG_SYN) && !tcp_plain_syn(p.tcp_flags)) {
			STAT_INC(drop_invalid_syn);
			return TC_ACT_SHOT;
		}
		if (p.proto == IPPROTO_TCP && !(p.tcp_flags & TCP_FLAG_SYN)) {
			STAT_INC(midstream);
			return TC_PASS;
		}
		if (master->count == 0)
			return reject_new_flow(skb, &p);
		__builtin_memset(to, 0, sizeof(*to));
		if (ct_create(skb, &p, &fkey, &skey, master, to, now, FLOW_FROM_POD))
			return TC_ACT_SHOT;
	}
	if (to->flags & CT_F_SNAT)
		return snat_forward(skb, &p, to);
	if (dnat(skb, &p, to))
		return TC_ACT_SHOT;
	return TC_PASS; /* the kernel routes it to the backend */
}

/* Egress, toward the pod: a reply of one of its flows leaves with the
 * frontend's address and port as its source. */
SEC("tc")
int kpr_pod_egress(struct __sk_buff *skb)
{
	return flow_reverse(skb);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
