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
#include <bpf/bpf_endian.h>

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
#define CT_F_STATE (CT_F_REPLIED | CT_F_FIN | CT_F_RST | CT_TCP_ESTABLISHED | CT_F_FIN_FWD | CT_F_FIN_REPLY)

/*
 * Two maps. A flow's entries live in kpr_ct_new until the flow has shown
 * traffic both ways (ct_assured: TCP established, UDP answered) and then
 * lived on: ct_touch moves them to kpr_conntrack at the flow's first
 * lifetime refresh, a forward packet at least CT_REFRESH_NS after the
 * packet that made it assured. A flow that is over (reset, or closed by a
 * FIN from each side) only waits out its closing time, and one in
 * kpr_conntrack moves back to kpr_ct_new for it. A SYN flood, spoofed or
 * not, churns only kpr_ct_new: when that is full its LRU evicts the oldest
 * half-open, short or closed flows, never a long-lived established one, as
 * netfilter's full table drops unassured entries and those of closing
 * connections first (early_drop, tcp_can_early_drop).
 *
 * Why not at the handshake, as netfilter marks a connection assured: a
 * move is a delete and an insert of each entry in an LRU hash, twice in a
 * flow's life, and a client that opens a connection per request paid them
 * on every request (a third of the packet path's BPF time for a pod, and
 * 6 to 10 % of its request rate against iptables: docs/dataplane-
 * benchmark.md). A flow in kpr_ct_new is kept by its LRU as long as it is
 * recent: the flood must insert a whole CPU's share of the map while the
 * flow is idle, and only an established connection that falls silent
 * right after its handshake can be that idle and that young (how long, for
 * a given flood: docs/tc-dataplane.md).
 *
 * A key is in one map at most: every store of a new entry removes it from
 * the other. Lookups try kpr_conntrack first, which holds the packets of
 * long flows, the most packets.
 */
static __always_inline struct ct_value *ct_lookup(const struct ct_key *key)
{
	struct ct_value *v = bpf_map_lookup_elem(&kpr_conntrack, key);

	if (!v)
		v = bpf_map_lookup_elem(&kpr_ct_new, key);
	return v;
}

/* Store the entry of a flow that has not shown traffic both ways yet. */
static __always_inline long ct_store_new(const struct ct_key *key, const struct ct_value *v, __u64 flags)
{
	bpf_map_delete_elem(&kpr_conntrack, key);
	return bpf_map_update_elem(&kpr_ct_new, key, v, flags);
}

static __always_inline void ct_delete(const struct ct_key *key)
{
	bpf_map_delete_elem(&kpr_conntrack, key);
	bpf_map_delete_elem(&kpr_ct_new, key);
}

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

/* Whether a TCP flow is over but for its closing time: reset, or closed by
 * a FIN from each side (netfilter's CLOSE and TIME_WAIT, whose tuples a
 * new connection may reuse). */
static __always_inline int ct_closed(__u8 flags)
{
	return (flags & CT_F_RST) || (flags & (CT_F_FIN_FWD | CT_F_FIN_REPLY)) == (CT_F_FIN_FWD | CT_F_FIN_REPLY);
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

/* Whether e's last packet is at least idle old: expires_ns is that
 * packet's time plus the lifetime its flags give (ct_touch). */
static __always_inline int ct_idle(const struct ct_value *e, __u8 proto, __u64 now, __u64 idle)
{
	return now + ct_lifetime_ns(proto, e->flags) >= e->expires_ns + idle;
}

/*
 * A flow that is over keeps what it holds (its reply entry's key, a SNAT
 * port) until its last packet is CT_CLOSED_IDLE_NS old: the client's last
 * ACK, or its reset, may still be on the way to the backend, whose
 * connection is then still open and drops a new SYN on the same ends; the
 * new flow's client waited out a second (seen in the hostile benchmark's
 * capture). TCP's minimum retransmission timeout.
 */
#define CT_CLOSED_IDLE_NS (NSEC_PER_SEC / 5)

/* Whether a TCP segment may open a flow: a SYN without ACK, RST or FIN.
 * The others with SYN are what netfilter calls INVALID for a new
 * connection. */
static __always_inline int tcp_plain_syn(__u8 tcp_flags)
{
	return (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST | TCP_FLAG_FIN)) == TCP_FLAG_SYN;
}

/*
 * The TCP window check. A RST or FIN changes a flow's lifetime only when its
 * sequence number lies in the window of the side it is sent to, as netfilter
 * accepts them (nf_conntrack_proto_tcp.c, tcp_in_window): otherwise one
 * spoofed or guessed segment with the client's address and port would end
 * any idle connection. Each entry keeps its own direction's part (struct
 * ct_value: win_flags, wscale, ack, max_win): the highest acknowledgment
 * number that direction sent, and the largest window it advertised, scaled.
 * A RST from one side is in the window if its sequence number lies in
 * [ack, ack + max_win] of the other side (RFC 5961's receive window; what
 * the receiver has acknowledged, and what it allows beyond); a FIN in
 * [ack - max_win, ack + max_win], since a retransmitted FIN may lie below
 * the receiver's acknowledgment. Each direction's entry is written by its
 * own packets only, and read only for a RST or FIN.
 *
 * An acknowledgment number is taken only if it moves forward by at most the
 * sender's own largest window (the other side cannot have sent further), so
 * a blind segment can move the window no more easily than it could hit it.
 *
 * Left out, against netfilter: the check of every other segment (netfilter
 * also judges data and ACKs, and the highest sequence number each side has
 * sent: td_end, td_maxend); SACK blocks; its rule that a RST in the window
 * but not at the exact expected number closes nothing until the challenge
 * ACK (RFC 5961) confirms it; and its retransmission counting. A flow whose
 * handshake kpr did not see (a Maglev flow picked up mid-stream, an entry
 * carried over from an earlier kpr), or whose SYN or SYN-ACK options kpr
 * could not read, has no window scale, and is not checked at all: netfilter
 * too is liberal with a connection it picked up mid-stream.
 */
#define CT_W_SYN 1	/* the flow's SYN passed kpr: its options were read */
#define CT_W_WSCALE 2	/* that SYN offered a window scale (in wscale) */
#define CT_W_KNOWN 4	/* the handshake passed kpr: windows are scaled by wscale */
#define CT_W_ACK 8	/* ack and max_win hold what this direction sent */

/* What the window check reads of a TCP segment. */
struct tcp_seg {
	__u32 seq;
	__u32 ack;
	__u16 win;	/* the window field, unscaled (16 bits: keeps the
			 * struct at 12 bytes, as the ingress stack is tight) */
	__u8 wscale;	/* a SYN's window scale option, or one of: */
	__u8 ok;	/* the segment was read */
};
#define WSCALE_NONE 0xfe	/* the SYN offers no window scale */
#define WSCALE_UNKNOWN 0xff	/* kpr could not read the SYN's options */
#define TCP_MAX_WSCALE 14	/* RFC 7323: a larger shift counts as 14 */

/* The TCP options a SYN can hold fit 40 bytes; one is at least a byte. The
 * window scale comes within a SYN's first five options on Linux, Windows
 * and macOS; a SYN whose options go on longer gets no check. */
#define TCP_OPT_STEPS 12
#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_WINDOW 3

/* The window scale option of the SYN whose options are the len bytes at
 * off. Read byte by byte through the helper: SYNs are few, and it keeps
 * every offset off the verifier's stack and packet bounds. A global
 * function, which the verifier checks once on its own, rather than once
 * for every path of each caller (a loop inlined there made kpr_tc_ingress
 * four times as costly to verify). */
__attribute__((noinline)) int tcp_syn_wscale(struct __sk_buff *skb, __u32 off, __u32 len)
{
	__u32 i = 0;
	__u8 kind, olen, ws;
	int n;

	for (n = 0; n < TCP_OPT_STEPS; n++) {
		if (i >= len)
			return WSCALE_NONE;
		if (bpf_skb_load_bytes(skb, off + i, &kind, 1))
			return WSCALE_UNKNOWN;
		if (kind == TCPOPT_EOL)
			return WSCALE_NONE;
		if (kind == TCPOPT_NOP) {
			i++;
			continue;
		}
		if (i + 2 > len || bpf_skb_load_bytes(skb, off + i + 1, &olen, 1) || olen < 2)
			return WSCALE_UNKNOWN;
		if (kind == TCPOPT_WINDOW) {
			if (olen != 3 || i + 3 > len || bpf_skb_load_bytes(skb, off + i + 2, &ws, 1))
				return WSCALE_UNKNOWN;
			return ws > TCP_MAX_WSCALE ? TCP_MAX_WSCALE : ws;
		}
		i += olen;
	}
	return i >= len ? WSCALE_NONE : WSCALE_UNKNOWN;
}

/* Read what the window check needs of p, a TCP segment, with a SYN's
 * window scale if syn_opts; seg->ok is 0 when it cannot be read, and the
 * segment then changes no window. */
static __always_inline void tcp_seg_read(struct __sk_buff *skb, const struct pkt *p, struct tcp_seg *seg,
					 int syn_opts)
{
	struct {
		__be32 seq;
		__be32 ack;
		__u8 doff;
		__u8 flags;
		__be16 win;
	} h;
	__u32 hlen;

	*seg = (struct tcp_seg){};
	if (p->proto != IPPROTO_TCP || bpf_skb_load_bytes(skb, p->l4_off + 4, &h, sizeof(h)))
		return;
	seg->seq = bpf_ntohl(h.seq);
	seg->ack = bpf_ntohl(h.ack);
	seg->win = bpf_ntohs(h.win);
	seg->wscale = WSCALE_NONE;
	if (syn_opts && (p->tcp_flags & TCP_FLAG_SYN)) {
		hlen = (h.doff >> 4) * 4;
		seg->wscale = hlen < 20 ? WSCALE_UNKNOWN : tcp_syn_wscale(skb, p->l4_off + 20, hlen - 20);
	}
	seg->ok = 1;
}

/* A new flow's forward entry from its first segment: a plain SYN whose
 * options were read starts the window state; anything else (a Maglev flow
 * picked up mid-stream) never gets one. */
static __always_inline void ct_win_open(struct ct_value *fwd, const struct pkt *p, const struct tcp_seg *seg)
{
	fwd->win_flags = 0;
	fwd->wscale = 0;
	if (!seg->ok || !tcp_plain_syn(p->tcp_flags) || seg->wscale == WSCALE_UNKNOWN)
		return;
	fwd->win_flags = CT_W_SYN;
	if (seg->wscale != WSCALE_NONE) {
		fwd->win_flags |= CT_W_WSCALE;
		fwd->wscale = seg->wscale;
	}
}

/* The backend's SYN-ACK settles both directions' window scales: each its
 * own when both SYNs offered one, else none (RFC 7323). */
static __always_inline void ct_win_synack(struct ct_value *fwd, struct ct_value *rev, const struct pkt *p,
					  const struct tcp_seg *seg)
{
	if (!seg->ok || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != (TCP_FLAG_SYN | TCP_FLAG_ACK) ||
	    !(fwd->win_flags & CT_W_SYN) || (fwd->win_flags & CT_W_KNOWN) || seg->wscale == WSCALE_UNKNOWN)
		return;
	if ((fwd->win_flags & CT_W_WSCALE) && seg->wscale != WSCALE_NONE) {
		rev->wscale = seg->wscale;
	} else {
		fwd->wscale = 0;
		rev->wscale = 0;
	}
	fwd->win_flags |= CT_W_KNOWN;
	rev->win_flags = CT_W_KNOWN;
}

/* Note the acknowledgment number and window of a segment in its own
 * direction's entry e: see the window check above. */
static __always_inline void ct_win_note(struct ct_value *e, const struct pkt *p, const struct tcp_seg *seg)
{
	__u32 win, moved;

	if (!seg->ok || !(e->win_flags & CT_W_KNOWN) || (p->tcp_flags & (TCP_FLAG_ACK | TCP_FLAG_RST)) != TCP_FLAG_ACK)
		return;
	/* A SYN's window is never scaled. */
	win = (__u32)seg->win << (p->tcp_flags & TCP_FLAG_SYN ? 0 : (e->wscale & 0xf));
	if (!(e->win_flags & CT_W_ACK)) {
		e->ack = seg->ack;
		e->max_win = win;
		e->win_flags |= CT_W_ACK;
		return;
	}
	moved = seg->ack - e->ack;
	if ((__s32)moved < 0 || moved > e->max_win)
		return;
	if (moved)
		e->ack = seg->ack;
	if (win > e->max_win)
		e->max_win = win;
}

/* Whether a RST or FIN (seg) lies in the window of the side it is sent to,
 * whose entry is to; a side that has sent no acknowledgment kpr could note
 * has no window to judge by, and the segment is taken. */
static __always_inline int ct_in_window(const struct ct_value *to, const struct pkt *p, const struct tcp_seg *seg)
{
	if (!seg->ok || !(to->win_flags & CT_W_ACK))
		return 1;
	if (p->tcp_flags & TCP_FLAG_RST)
		return seg->seq - to->ack <= to->max_win;
	return seg->seq - (to->ack - to->max_win) <= 2 * to->max_win;
}

/* What a packet of the flow in direction dir (enum ct_dir) shows: a FIN or
 * RST, and a TCP segment without SYN, which is half of being established. */
static __always_inline __u8 ct_seen(const struct pkt *p, __u8 dir)
{
	__u8 f;

	if (p->proto != IPPROTO_TCP)
		return 0;
	f = (p->tcp_flags & TCP_FLAG_RST ? CT_F_RST : 0) | (p->tcp_flags & TCP_FLAG_FIN ? CT_F_FIN : 0);
	if (p->tcp_flags & TCP_FLAG_FIN)
		f |= dir == CT_DIR_FORWARD ? CT_F_FIN_FWD : CT_F_FIN_REPLY;
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
 * Move a flow between the maps ("Two maps" above): to kpr_conntrack once
 * it has lived on after showing traffic both ways (to_new 0), back to
 * kpr_ct_new when it is over (to_new 1). ct and rev are its entries, key
 * holds rev's key on entry, and the forward key is built from the client
 * and the frontend rev names. One key buffer, rebuilt, since the ingress
 * program's stack has no room for a second; ct and rev point to deleted
 * entries on return. An entry that cannot be copied stays where it is.
 * to_new is a constant at each call, so each move names its two maps
 * directly.
 */
static __always_inline void ct_move(struct ct_value *ct, struct ct_value *rev, struct ct_key *key,
				    const __u32 client[4], __u16 client_port, __u8 proto, int to_new)
{
	void *to = to_new ? (void *)&kpr_ct_new : (void *)&kpr_conntrack;
	void *from = to_new ? (void *)&kpr_conntrack : (void *)&kpr_ct_new;
	const struct ct_value *moved;

	if (bpf_map_update_elem(to, key, rev, BPF_ANY))
		return;
	ct_key_of(key, client, client_port, rev->addr, rev->port, proto, CT_DIR_FORWARD);
	if (bpf_map_update_elem(to, key, ct, BPF_ANY))
		return;
	bpf_map_delete_elem(from, key);
	moved = bpf_map_lookup_elem(to, key);
	if (!moved)
		return;
	ct_reply_key(key, moved, client, client_port, proto);
	bpf_map_delete_elem(from, key);
}

/*
 * Note what a packet shows in the flow's forward entry and extend its
 * lifetime. A SNATed flow's reply entry gets the same lifetime, since it
 * holds the flow's port, and the same state, which says whether a new flow
 * may take the port over (nat.h). Both are written when the state changes,
 * and otherwise only when the lifetime gains CT_REFRESH_NS. Such a refresh
 * of a live assured flow still in kpr_ct_new moves it to kpr_conntrack,
 * and the packet that ends a flow in kpr_conntrack moves it back ("Two
 * maps"); the reply entry's map says where the flow lives. ct then points
 * to a deleted entry, so callers copy what they need first.
 */
static __always_inline void ct_touch(struct ct_value *ct, const __u32 client[4], __u16 client_port,
				     __u8 proto, __u8 new_flags, __u64 now)
{
	struct ct_key rkey = {};
	struct ct_value *rev;
	__u8 flags = ct->flags | new_flags;
	int over = proto == IPPROTO_TCP && ct_closed(flags);
	int refresh = flags == ct->flags && !(new_flags & (CT_F_RST | CT_F_FIN));
	int may_promote = refresh && ct_assured(proto, flags) && !over;
	int may_demote = over && !ct_closed(ct->flags) && ct_assured(proto, ct->flags); /* over: TCP */
	int kept;
	__u64 expires;

	expires = now + ct_lifetime_ns(proto, flags);
	/* A RST or FIN shortens the lifetime, which must be written now. */
	if (flags == ct->flags && expires <= ct->expires_ns + CT_REFRESH_NS &&
	    !(new_flags & (CT_F_RST | CT_F_FIN)))
		return;
	ct->flags = flags;
	ct->expires_ns = expires;
	if (!(flags & CT_F_SNAT) && !may_promote && !may_demote)
		return;
	ct_reply_key(&rkey, ct, client, client_port, proto);
	rev = bpf_map_lookup_elem(&kpr_conntrack, &rkey);
	kept = rev != NULL;
	if (!rev)
		rev = bpf_map_lookup_elem(&kpr_ct_new, &rkey);
	if (!rev)
		return;
	if (flags & CT_F_SNAT) {
		rev->expires_ns = expires;
		rev->flags |= flags & CT_F_STATE;
	}
	if (may_promote && !kept)
		ct_move(ct, rev, &rkey, client, client_port, proto, 0);
	else if (may_demote && kept)
		ct_move(ct, rev, &rkey, client, client_port, proto, 1);
}

/*
 * Whether old, the reply entry found under the key a new flow without SNAT
 * needs (its backend answering the client's address and port), belongs to
 * no live flow, so that the new flow may replace it. The key does not name
 * the frontend: a flow from the same client address and port to another
 * frontend with the same backend (a sibling NodePort of the same Service)
 * holds it, and replacing it would send that flow's replies out from the
 * wrong frontend. Its flow is over when its forward entry is gone, expired,
 * reset or sends elsewhere, closed (CT_CLOSED_IDLE_NS ago), or when it is
 * the new flow's own forward key, which ct_usable found over. A closed
 * flow must give way: a client that closes many short connections keeps
 * each in its closing time (ct_tcp_fin_s) while its kernel may pick the
 * same source port for a connection to another frontend at once, and one
 * backend behind many Services made 1.5% of a bypassed pod's connections
 * wait for a SYN retransmit (the e2e scenarios). A SNATed flow's reply
 * entry keeps its own lifetime.
 */
static __always_inline int ct_reply_free(const struct ct_value *old, const struct ct_key *rkey,
					 const struct pkt *p, __u64 now)
{
	struct ct_key okey = {};
	const struct ct_value *ofwd;

	if (old->flags & CT_F_SNAT)
		return now > old->expires_ns;
	if (old->port == p->dport && addr_eq(old->addr, p->daddr))
		return 1;
	ct_key_of(&okey, p->saddr, p->sport, old->addr, old->port, p->proto, CT_DIR_FORWARD);
	ofwd = ct_lookup(&okey);
	return !ofwd || now > ofwd->expires_ns || (ofwd->flags & (CT_F_RST | CT_F_SNAT)) ||
	       ofwd->port != rkey->sport || !addr_eq(ofwd->addr, rkey->saddr) ||
	       (ct_closed(ofwd->flags) && ct_idle(ofwd, p->proto, now, CT_CLOSED_IDLE_NS));
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
 * A packet from the client of a known flow, whose forward entry is ct: what
 * it shows (ct_seen), or -1 for a RST or FIN outside the backend's window
 * (counted), which must change nothing and is dropped. Its window is noted
 * in ct.
 */
static __always_inline int ct_forward_seen(struct __sk_buff *skb, struct ct_value *ct, const struct pkt *p)
{
	struct tcp_seg seg = {};
	struct ct_key rkey = {};
	const struct ct_value *rev;

	if (p->proto != IPPROTO_TCP)
		return 0;
	tcp_seg_read(skb, p, &seg, 0);
	if (p->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN)) {
		ct_reply_key(&rkey, ct, p->saddr, p->sport, p->proto);
		rev = ct_lookup(&rkey);
		if (rev && !ct_in_window(rev, p, &seg)) {
			STAT_INC(drop_out_of_window);
			return -1;
		}
	}
	ct_win_note(ct, p, &seg);
	return ct_seen(p, CT_DIR_FORWARD);
}

/*
 * A reply passed: the forward entry learns what it shows that the reply
 * entry has not passed on yet (the first reply, the backend's first segment
 * without SYN, which completes the handshake), and of every FIN or RST,
 * which shorten its lifetime. rev is the reply entry, from its copy; the
 * flow's client is the address and port the reply goes to, or those the
 * flow was SNATed from. Returns -1 for a RST or FIN outside the client's
 * window (counted), which changes nothing and is dropped.
 */
static __always_inline int note_reply(struct __sk_buff *skb, struct ct_value *rev, const struct ct_value *from,
				      const struct pkt *p)
{
	const __u32 *client = from->flags & CT_F_SNAT ? from->nat_addr : p->daddr;
	__u16 client_port = from->flags & CT_F_SNAT ? from->nat_port : p->dport;
	struct ct_key fkey = {};
	struct ct_value *fwd;
	struct tcp_seg seg = {};
	__u8 flags = ct_seen(p, CT_DIR_REPLY) | CT_F_REPLIED;

	/* Only the first reply can be the SYN-ACK that settles the scales. */
	tcp_seg_read(skb, p, &seg, !(rev->flags & CT_F_REPLIED));
	if ((rev->flags & flags) == flags && !(flags & (CT_F_FIN | CT_F_RST))) {
		ct_win_note(rev, p, &seg);
		return 0;
	}
	ct_key_of(&fkey, client, client_port, from->addr, from->port, p->proto, CT_DIR_FORWARD);
	fwd = ct_lookup(&fkey);
	if (fwd && (flags & (CT_F_FIN | CT_F_RST)) && !ct_in_window(fwd, p, &seg)) {
		STAT_INC(drop_out_of_window);
		return -1;
	}
	if (fwd)
		ct_win_synack(fwd, rev, p, &seg);
	ct_win_note(rev, p, &seg);
	rev->flags |= flags;
	if (fwd)
		ct_touch(fwd, client, client_port, p->proto, flags, bpf_ktime_get_ns());
	return 0;
}
