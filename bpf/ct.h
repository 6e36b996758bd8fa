/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The tc programs' conntrack (kpr_conntrack, struct ct_key and struct
 * ct_value in types.h): the keys of a flow's two entries, how long a flow
 * lives, and what its packets teach its entries. Each flow has a forward
 * entry (client -> frontend, naming the backend) and a reply entry
 * (backend -> client, or -> the node's SNAT address and port, naming the
 * frontend).
 */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "pkt.h"

#define NSEC_PER_SEC 1000000000ULL

/*
 * Conntrack lifetimes in seconds, set by the loader. A TCP flow is
 * established only once a segment without SYN has passed in each direction:
 * the client's handshake ACK (or later) and the backend's first ACK or data
 * after its SYN-ACK. Until then it has the handshake lifetime, as netfilter
 * keeps a connection in SYN_SENT or SYN_RECV until the client's ACK: a SYN,
 * spoofed or not, answered by a SYN-ACK and nothing more holds its entries
 * and SNAT port for that long only. 60 s is netfilter's SYN_RECV; a
 * lifetime counts from a flow's last packet, so it outlasts every SYN
 * retransmit interval of Linux but the seventh (64 s), after which a SYN
 * simply opens the flow again. The others are the netfilter timeouts
 * kube-proxy runs with: established (kube-proxy's
 * --conntrack-tcp-timeout-established), TIME_WAIT after a FIN, CLOSE after
 * a RST, and UDP before and after a reply (udp_timeout, udp_timeout_stream).
 */
volatile const __u32 ct_tcp_syn_s = 60;
volatile const __u32 ct_tcp_established_s = 86400;
volatile const __u32 ct_tcp_fin_s = 120;
volatile const __u32 ct_tcp_rst_s = 10;
volatile const __u32 ct_udp_s = 30;
volatile const __u32 ct_udp_stream_s = 120;

/* The conntrack enums reach BTF only through a use of their type: these
 * constants are that use, so that Go can check its copies of the values
 * (maps/conntrack.go) against this object. Nothing reads them. */
volatile const enum ct_dir btf_ct_dir = CT_DIR_FORWARD;
volatile const enum ct_flags btf_ct_flags = CT_F_REPLIED;

/* A flow's lifetime is written back only when it gains at least this much,
 * so an established flow does not write its entry on every packet. */
#define CT_REFRESH_NS NSEC_PER_SEC

/* A TCP flow with both is established. */
#define CT_TCP_ESTABLISHED (CT_F_ACK_FWD | CT_F_ACK_REPLY)

/* What the forward entry keeps of the flow's state, and a SNATed flow's
 * reply entry mirrors. */
#define CT_F_STATE (CT_F_REPLIED | CT_F_FIN | CT_F_RST | CT_TCP_ESTABLISHED)

/* ct_key_of fills key for the flow saddr:sport -> daddr:dport in one
 * direction; the caller's key is zeroed, so its padding hashes alike. */
static __always_inline void ct_key_of(struct ct_key *key, const __u32 *saddr, __u16 sport,
				      const __u32 *daddr, __u16 dport, __u8 proto, __u8 dir)
{
	addr_copy(key->saddr, saddr);
	addr_copy(key->daddr, daddr);
	key->sport = sport;
	key->dport = dport;
	key->proto = proto;
	key->dir = dir;
}

/*
 * Whether a flow has shown traffic both ways: TCP established, UDP
 * answered. Only such a flow keeps its SNAT port against a new flow that
 * finds no free one (nat.h): netfilter's "assured", which its table drops
 * last when it is full.
 */
static __always_inline int ct_assured(__u8 proto, __u8 flags)
{
	if (proto == IPPROTO_TCP)
		return (flags & CT_TCP_ESTABLISHED) == CT_TCP_ESTABLISHED;
	return flags & CT_F_REPLIED;
}

/* How long a flow lives after a packet, given what it has shown. A FIN
 * gives an established flow its closing time; one that never got that far
 * keeps the shorter handshake lifetime. */
static __always_inline __u64 ct_lifetime_ns(__u8 proto, __u8 flags)
{
	__u32 s;

	if (proto == IPPROTO_TCP) {
		if (flags & CT_F_RST)
			s = ct_tcp_rst_s;
		else if (!ct_assured(proto, flags))
			s = ct_tcp_syn_s;
		else if (flags & CT_F_FIN)
			s = ct_tcp_fin_s;
		else
			s = ct_tcp_established_s;
	} else {
		s = (flags & CT_F_REPLIED) ? ct_udp_stream_s : ct_udp_s;
	}
	return (__u64)s * NSEC_PER_SEC;
}

/* Whether a TCP segment may open a flow: a SYN without ACK, RST or FIN.
 * The others with SYN are what netfilter calls INVALID for a new
 * connection. */
static __always_inline int tcp_plain_syn(__u8 tcp_flags)
{
	return (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST | TCP_FLAG_FIN)) == TCP_FLAG_SYN;
}

/* What a packet of the flow in direction dir (enum ct_dir) shows: a FIN or
 * RST, and a TCP segment without SYN, which is half of being established. */
static __always_inline __u8 ct_seen(const struct pkt *p, __u8 dir)
{
	__u8 f;

	if (p->proto != IPPROTO_TCP)
		return 0;
	f = (p->tcp_flags & TCP_FLAG_RST ? CT_F_RST : 0) | (p->tcp_flags & TCP_FLAG_FIN ? CT_F_FIN : 0);
	if (!(p->tcp_flags & TCP_FLAG_SYN))
		f |= dir == CT_DIR_FORWARD ? CT_F_ACK_FWD : CT_F_ACK_REPLY;
	return f;
}

/* The reply entry key of a flow, from its forward entry: the backend
 * answering the client, or the node address it was SNATed to. */
static __always_inline void ct_reply_key(struct ct_key *rkey, const struct ct_value *fwd,
					 const __u32 client[4], __u16 client_port, __u8 proto)
{
	addr_copy(rkey->saddr, fwd->addr);
	rkey->sport = fwd->port;
	if (fwd->flags & CT_F_SNAT) {
		addr_copy(rkey->daddr, fwd->nat_addr);
		rkey->dport = fwd->nat_port;
	} else {
		addr_copy(rkey->daddr, client);
		rkey->dport = client_port;
	}
	rkey->proto = proto;
	rkey->dir = CT_DIR_REPLY;
}

/*
 * Note what a packet shows in the flow's forward entry and extend its
 * lifetime. A SNATed flow's reply entry gets the same lifetime, since it
 * holds the flow's port, and the same state, which says whether a new flow
 * may take the port over (nat.h). Both are written when the state changes,
 * and otherwise only when the lifetime gains CT_REFRESH_NS.
 */
static __always_inline void ct_touch(struct ct_value *ct, const __u32 client[4], __u16 client_port,
				     __u8 proto, __u8 new_flags, __u64 now)
{
	struct ct_key rkey = {};
	struct ct_value *rev;
	__u8 flags = ct->flags | new_flags;
	__u64 expires;

	expires = now + ct_lifetime_ns(proto, flags);
	/* A RST or FIN shortens the lifetime, which must be written now. */
	if (flags == ct->flags && expires <= ct->expires_ns + CT_REFRESH_NS &&
	    !(new_flags & (CT_F_RST | CT_F_FIN)))
		return;
	ct->flags = flags;
	ct->expires_ns = expires;
	if (!(flags & CT_F_SNAT))
		return;
	ct_reply_key(&rkey, ct, client, client_port, proto);
	rev = bpf_map_lookup_elem(&kpr_conntrack, &rkey);
	if (rev) {
		rev->expires_ns = expires;
		rev->flags |= flags & CT_F_STATE;
	}
}

/* Whether the backend a flow was sent to is still the one behind its id. */
static __always_inline int ct_backend_live(const struct ct_value *ct)
{
	__u32 id = ct->backend_id;
	const struct backend *be = bpf_map_lookup_elem(&kpr_backends, &id);

	return be && be->port == ct->port && be->addr[0] == ct->addr[0] &&
	       be->addr[1] == ct->addr[1] && be->addr[2] == ct->addr[2] &&
	       be->addr[3] == ct->addr[3];
}

/*
 * An entry whose flow is over: expired, a TCP SYN that opens a new
 * connection on the ports of a closed one, or a backend that is gone. The
 * backend is checked when the lifetime is due to be extended, once a second
 * at most, not on every packet: a flow leaves a removed backend within a
 * second.
 */
static __always_inline int ct_usable(const struct ct_value *ct, const struct pkt *p, __u64 now)
{
	if (now > ct->expires_ns)
		return 0;
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN &&
	    (ct->flags & (CT_F_FIN | CT_F_RST)))
		return 0;
	if (now + ct_lifetime_ns(p->proto, ct->flags) <= ct->expires_ns + CT_REFRESH_NS)
		return 1;
	return ct_backend_live(ct);
}

/*
 * A reply passed: the forward entry learns what it shows that the reply
 * entry has not passed on yet (the first reply, the backend's first segment
 * without SYN, which completes the handshake), and of every FIN or RST,
 * which shorten its lifetime. rev is the reply entry, from its copy;
 * client the flow's client.
 */
static __always_inline void note_reply(struct ct_value *rev, const struct ct_value *from,
				       const struct pkt *p, const __u32 client[4], __u16 client_port)
{
	struct ct_key fkey = {};
	struct ct_value *fwd;
	__u8 flags = ct_seen(p, CT_DIR_REPLY) | CT_F_REPLIED;

	if ((rev->flags & flags) == flags && !(flags & (CT_F_FIN | CT_F_RST)))
		return;
	rev->flags |= flags;
	ct_key_of(&fkey, client, client_port, from->addr, from->port, p->proto, CT_DIR_FORWARD);
	fwd = bpf_map_lookup_elem(&kpr_conntrack, &fkey);
	if (fwd)
		ct_touch(fwd, client, client_port, p->proto, flags, bpf_ktime_get_ns());
}
