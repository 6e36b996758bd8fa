/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The types of kpr's maps, shared by every BPF program object (each .c file
 * under bpf/) and, through bpf2go -type, by the Go control plane. This file
 * is the single definition of these structs and enums: the maps that use
 * them are in maps.h.
 *
 * Addresses are always 16 bytes in network byte order. IPv4 is stored in
 * its v4-mapped IPv6 form (::ffff:a.b.c.d) so that one map serves both
 * families and a dual-stack socket connecting to ::ffff:VIP finds the IPv4
 * Service without a second lookup.
 */
#pragma once

#include <linux/types.h>

/* Which backend set a lookup wants (svc_key.scope). */
enum svc_scope {
	/* Traffic from sockets on this node: every cgroup hook uses this. */
	SVC_SCOPE_INTERNAL = 0,
	/* Traffic arriving from outside the node (externalTrafficPolicy). */
	SVC_SCOPE_EXTERNAL = 1,
};

/*
 * How a frontend address came to exist (svc_value.kind). The pinned service
 * map outlives kpr's process, so these numbers are what a later kpr reads
 * back: never renumber a value, only add new ones. Go converts to and from
 * dataplane.FrontendKind explicitly (maps/encoding.go), never by number.
 */
enum svc_kind {
	SVC_KIND_CLUSTER_IP = 0,
	SVC_KIND_NODE_PORT = 1,
	SVC_KIND_EXTERNAL_IP = 2,
	SVC_KIND_LOAD_BALANCER = 3,
};

/* svc_value.flags: what a master entry asks of the tc programs beyond its
 * backends. Like enum svc_kind, persisted: never renumber. */
enum svc_flags {
	/* loadBalancerSourceRanges: a new flow from outside is served only
	 * when kpr_src_ranges holds its source for this frontend. */
	SVC_F_SOURCE_RANGES = 1,
};

struct svc_key {
	__u32 addr[4];	/* frontend address */
	__u16 port;	/* frontend port, network byte order */
	__u8 proto;	/* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;	/* enum svc_scope */
	__u16 slot;	/* 0: master entry; 1..count: backend slots */
	__u16 pad;
};

struct svc_value {
	__u32 backend_id;	/* slots only: key into the backend map */
	__u32 rev_nat_id;	/* master only: key into the rev_nat map */
	__u32 affinity_timeout;	/* master only: ClientIP affinity, seconds; 0 = off */
	__u16 count;		/* master only: number of backend slots */
	__u8 kind;		/* master only: enum svc_kind, for display;
				 * only Go reads it. A __u8, not the enum, keeps
				 * the value layout of earlier pinned maps. */
	__u8 flags;		/* master only: enum svc_flags. Was padding, so
				 * earlier pinned entries read as no flags. */
};

struct backend {
	__u32 addr[4];
	__u16 port;	/* network byte order */
	__u8 proto;
	__u8 state;	/* 0 = active; other values are reserved */
};

/* rev_nat map value: the frontend a rev_nat_id stands for. */
struct rev_nat_value {
	__u32 addr[4];
	__u16 port;	/* network byte order */
	__u16 pad;
};

/*
 * Per-socket reverse translation: a socket (cookie) that was sent to a
 * backend sees the frontend it asked for in recvmsg and getpeername.
 */
struct sock_rev_key {
	__u64 cookie;
	__u32 addr[4];	/* backend address */
	__u16 port;	/* backend port, network byte order */
	__u16 pad[3];
};

struct sock_rev_value {
	__u32 addr[4];	/* frontend address */
	__u16 port;	/* frontend port, network byte order */
	__u16 pad;
	__u32 rev_nat_id;
};

/* ClientIP session affinity. At the socket layer the client is a netns. */
struct affinity_key {
	__u64 client;	/* network namespace cookie */
	__u32 rev_nat_id;
	__u32 pad;
};

struct affinity_value {
	__u64 last_used_ns;	/* bpf_ktime_get_ns() of the last use */
	__u32 backend_id;
	__u32 pad;
};

/*
 * Which backends a Service with ClientIP affinity still has: one entry per
 * (frontend, scope, backend) while the backend is in that Service's slots.
 * An affinity entry naming a backend without a match entry is stale (the
 * backend left the Service, or its id now names another backend) and is
 * ignored, so a client never sticks to a removed endpoint.
 */
struct affinity_match_key {
	__u32 backend_id;
	__u32 rev_nat_id;
	__u8 scope;	/* enum svc_scope */
	__u8 pad[3];
};

/*
 * A backend that left a UDP frontend. While the control plane runs the
 * socket-termination iterator, one entry per (frontend, removed backend)
 * says which connected UDP sockets to destroy: those kpr translated from
 * that frontend to that backend (kpr_sock_rev knows which).
 */
struct sock_term_key {
	__u32 backend_addr[4];
	__u32 frontend_addr[4];
	__u16 backend_port;	/* network byte order */
	__u16 frontend_port;	/* network byte order */
};

/*
 * Packet-level conntrack of the tc programs (tc_nodeport.c), for traffic
 * that arrives from other machines. A translated flow has two entries: the
 * forward one, keyed by the packet as the client sent it (client ->
 * frontend), names the backend its first packet picked; the reply one,
 * keyed by the backend's reply (backend -> client), names the frontend the
 * client talked to, so the reply can be restored to it.
 */
enum ct_dir {
	CT_DIR_FORWARD = 0,
	CT_DIR_REPLY = 1,
};

/* ct_value.flags: what the flow has shown so far. A TCP flow is
 * established once it has both CT_F_ACK_FWD and CT_F_ACK_REPLY (ct.h). */
enum ct_flags {
	CT_F_REPLIED = 1,	/* a reply has passed: UDP a stream; TCP at least
				 * the backend's SYN-ACK */
	CT_F_FIN = 2,		/* TCP FIN seen in either direction */
	CT_F_RST = 4,		/* TCP RST seen in either direction */
	CT_F_SNAT = 8,		/* the flow leaves from a node address (nat_addr):
				 * its backend is on another node */
	CT_F_ACK_FWD = 16,	/* TCP: a segment without SYN came from the client
				 * (its handshake ACK, or later) */
	CT_F_ACK_REPLY = 32,	/* TCP: a segment without SYN came from the backend */
	CT_F_FIN_FWD = 64,	/* TCP: the client sent a FIN */
	CT_F_FIN_REPLY = 128,	/* TCP: the backend sent a FIN */
};

struct ct_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;	/* network byte order */
	__u16 dport;	/* network byte order */
	__u8 proto;	/* IPPROTO_TCP or IPPROTO_UDP */
	__u8 dir;	/* enum ct_dir */
	__u16 pad;
};

struct ct_value {
	__u64 expires_ns;	/* bpf_ktime_get_ns() past which the flow is over
				 * and its next packet picks anew; a reply entry
				 * of a SNATed flow keeps its port until then */
	__u32 addr[4];		/* forward: the backend; reply: the frontend */
	__u32 nat_addr[4];	/* CT_F_SNAT only. forward: the node address the
				 * flow leaves from; reply: the client */
	__u16 port;		/* network byte order */
	__u16 nat_port;		/* CT_F_SNAT only, network byte order.
				 * forward: the source port; reply: the client's */
	__u8 flags;		/* enum ct_flags, kept in the forward entry.
				 * The reply entry has CT_F_SNAT, the reply bits
				 * it passed on (CT_F_REPLIED, CT_F_ACK_REPLY),
				 * and, when SNATed, the forward entry's state
				 * too: port takeover reads it there */
	/* TCP, this entry's direction (the forward entry the client's, the
	 * reply entry the backend's): what the window check of a RST or FIN
	 * from the other direction reads (ct.h). All zero, as in an entry
	 * of an earlier kpr, means no check. */
	__u8 win_flags;		/* CT_W_* of ct.h */
	__u8 wscale;		/* its window scale (RFC 7323), 0 unless both
				 * SYNs offered one */
	__u8 pad;
	__u32 backend_id;	/* the backend's id in kpr_backends */
	__u32 rev_nat_id;	/* the frontend's id in kpr_rev_nat */
	__u32 ack;		/* TCP: the highest acknowledgment number this
				 * direction sent, host order */
	__u32 max_win;		/* TCP: the largest window it advertised, scaled */
};

/*
 * ClientIP session affinity of the tc programs: from outside, the client is
 * an address. The value is struct affinity_value, and a backend counts only
 * while kpr_affinity_match has it for the Service, as at the socket layer.
 */
struct tc_affinity_key {
	__u32 client[4];
	__u32 rev_nat_id;
	__u8 scope;	/* enum svc_scope */
	__u8 pad[3];
};

/*
 * One of the devices kpr's tc programs are attached to (kpr_tc_devices, by
 * ifindex): the node's address on it per family, in the 16-byte form, all
 * zero where the device has none. A new flow to a backend on another node
 * is SNATed to it where the kernel's FIB lookup cannot name the source
 * (BPF_FIB_LOOKUP_SRC is Linux 6.7+).
 */
struct tc_device {
	__u32 addr4[4];
	__u32 addr6[4];
};

/*
 * Per-CPU counters of the tc programs, one field per reason, in the single
 * entry of kpr_tc_stats. New reasons are appended.
 */
struct nat_stats {
	__u64 translated;	/* packets to a frontend rewritten to a backend */
	__u64 reversed;		/* replies rewritten back to the frontend */
	__u64 new_flows;	/* conntrack entries created */
	__u64 drop_no_backend;	/* frontend without a backend for this traffic */
	__u64 drop_ct_insert;	/* new flow dropped: its conntrack entries could
				 * not be stored */
	__u64 drop_rewrite;	/* a header rewrite failed */
	__u64 cluster_ip_outside; /* a ClusterIP from outside, passed untouched */
	__u64 fragment;		/* later IP fragments whose first fragment kpr
				 * has not seen (reordered, or its entry left
				 * kpr_frags), passed untranslated */
	__u64 snat;		/* new flows SNATed to a backend on another node */
	__u64 drop_snat_ports;	/* new flow dropped: no free SNAT port */
	__u64 redirected;	/* packets sent out through a FIB lookup */
	__u64 icmp_translated;	/* ICMP errors about a translated flow, rewritten */
	__u64 affinity_hit;	/* new flows sent to their client's affinity backend */
	__u64 drop_source_range; /* new flow to a LoadBalancer IP from outside
				  * its loadBalancerSourceRanges, dropped */
	__u64 midstream;	/* TCP segments other than a SYN to a frontend,
				 * of no flow kpr knows, passed untranslated */
	__u64 drop_loopback;	/* packets from the wire to a loopback address
				 * (127.0.0.0/8, ::1), dropped as the kernel would */
	__u64 v4_mapped;	/* IPv6 packets with a v4-mapped address
				 * (::ffff:a.b.c.d), passed untranslated */
	__u64 snat_takeover;	/* new flows given the SNAT port of a flow that
				 * had not shown traffic both ways */
	__u64 drop_invalid_syn;	/* SYN with ACK, RST or FIN to a frontend, of
				 * no flow kpr knows: opens none, dropped */
	__u64 drop_out_of_window; /* TCP RST or FIN of a known flow whose
				   * sequence number lies outside the
				   * receiver's window: dropped, the flow's
				   * lifetime unchanged */
	__u64 drop_reply_taken;	/* new flow dropped: its reply entry (no SNAT)
				 * would replace a live flow's, which another
				 * frontend's flow from the same client address
				 * and port to the same backend holds */
	__u64 icmp_too_big;	/* ICMP errors kpr sent to a sender whose packet
				 * did not fit the route kpr sends it on:
				 * fragmentation needed, or packet too big */
	__u64 drop_fragment;	/* a later fragment to a frontend whose first
				 * fragment left no flow: it opens none, dropped */
	__u64 ipv6_ext_unparsed; /* IPv6 packets whose TCP or UDP header lies
				  * behind an extension header kpr does not
				  * follow, passed untranslated */
	__u64 rejected;		/* new flows of a pod refused for a frontend
				 * without a backend (a TCP reset, or ICMP port
				 * unreachable for UDP), as by kube-proxy's
				 * REJECT rule */
};

/*
 * IP fragments of the tc programs (kpr_frags). Only the first fragment of
 * a datagram carries its TCP or UDP header, so the programs record the
 * ports they find there under the datagram's identity, and translate each
 * later fragment, which carries no ports, as its first fragment was. IPv4
 * and IPv6 share the map: addresses in the 16-byte form, the 16-bit IPv4
 * id or the 32-bit IPv6 one.
 */
struct frag_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 id;	/* network byte order */
	__u8 proto;	/* IPv4: the protocol field; IPv6: the fragment
			 * header's next header, the same in every fragment */
	__u8 pad[3];
};

struct frag_value {
	__u16 sport;	/* network byte order */
	__u16 dport;	/* network byte order */
	__u8 proto;	/* IPPROTO_TCP or IPPROTO_UDP */
	__u8 tcp_flags;	/* the first fragment's, so that conntrack sees every
			 * fragment as it saw the first */
	__u16 pad;
};

/*
 * loadBalancerSourceRanges of the tc programs (kpr_src_ranges, an LPM
 * trie): one entry per (LoadBalancer frontend, source range). The
 * frontend part is always matched in full; prefixlen counts its
 * SRC_RANGE_FRONTEND_BITS plus the range's bits, of an IPv4 range in its
 * v4-mapped form (96 + its bits). A lookup uses the client's address and
 * SRC_RANGE_FRONTEND_BITS + 128.
 */
#define SRC_RANGE_FRONTEND_BITS 160

struct src_range_key {
	__u32 prefixlen;
	__u32 frontend[4];	/* the LoadBalancer IP */
	__u16 port;		/* frontend port, network byte order */
	__u8 proto;		/* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
	__u32 source[4];	/* the range's network address */
};

/*
 * Maglev consistent hashing of the tc programs (kpr run --lb-algorithm
 * maglev): the key of kpr_maglev, one table per frontend and scope, whose
 * value is an array of backend ids (one per slot) that the control plane
 * builds (maps/maglev) and swaps in whole.
 */
struct maglev_key {
	__u32 rev_nat_id;	/* the frontend */
	__u8 scope;		/* enum svc_scope */
	__u8 pad[3];
};

/*
 * Datapath counters and live trace of the socket hooks (sock_lb.c).
 *
 * kpr_sock_stats is a per-CPU array with one struct sock_stats per hook,
 * indexed by enum sock_hook; its count[] is indexed by enum sock_verdict.
 * Both enums may only grow at the end: Go reads the pinned map by these
 * numbers.
 */
enum sock_hook {
	SOCK_HOOK_CONNECT4 = 0,
	SOCK_HOOK_CONNECT6 = 1,
	SOCK_HOOK_SENDMSG4 = 2,
	SOCK_HOOK_SENDMSG6 = 3,
	SOCK_HOOK_RECVMSG4 = 4,
	SOCK_HOOK_RECVMSG6 = 5,
	SOCK_HOOK_GETPEERNAME4 = 6,
	SOCK_HOOK_GETPEERNAME6 = 7,
	SOCK_HOOK_COUNT,
};

enum sock_verdict {
	/* Not a frontend (connect, sendmsg), or no reverse entry (recvmsg,
	 * getpeername): the address is left alone. */
	SOCK_VERDICT_PASSED = 0,
	/* connect, sendmsg: frontend to backend; recvmsg, getpeername:
	 * backend back to frontend. */
	SOCK_VERDICT_TRANSLATED = 1,
	/* A frontend without endpoints: the syscall fails. */
	SOCK_VERDICT_REJECTED = 2,
	/* connect, sendmsg: a frontend, but the socket's pod is not served
	 * by the socket hooks (enum sock_lb_mode): the address is left for
	 * the packet path. */
	SOCK_VERDICT_BYPASSED = 3,
	SOCK_VERDICT_COUNT,
};

struct sock_stats {
	__u64 count[SOCK_VERDICT_COUNT];
};

/*
 * Which sockets the socket hooks serve (kpr run --socket-lb), a constant of
 * sock_lb.c. Sockets they do not serve keep the Service address, and their
 * packets meet the Service at packet level instead.
 */
enum sock_lb_mode {
	/* Every socket under the cgroup root. */
	SOCK_LB_ALL = 0,
	/* Only sockets of the node's own network namespace, as Cilium's
	 * socketLB.hostNamespaceOnly. */
	SOCK_LB_HOST_ONLY = 1,
	/* Every socket but those of the pods in kpr_sock_bypass, which the
	 * control plane chooses pod by pod. */
	SOCK_LB_PER_POD = 2,
};

/*
 * Why a pod is left to the packet path: the value of kpr_sock_bypass, whose
 * key is the pod's network namespace cookie. Read by operators (bpftool,
 * kpr dump) rather than by the programs, which only look for the key.
 */
enum sock_bypass_reason {
	SOCK_BYPASS_ANNOTATION = 1,	/* kpr.io/socket-lb: "bypass" */
	SOCK_BYPASS_MESH = 2,		/* an injected Istio or Linkerd sidecar */
	SOCK_BYPASS_SANDBOX = 3,	/* a VM or sandbox runtime */
};

struct sock_bypass {
	enum sock_bypass_reason reason;
};

/*
 * `kpr trace` sessions. Each running trace claims a session number below
 * TRACE_MAX_SESSIONS by inserting its own ring buffer into kpr_trace_rings
 * (BPF_NOEXIST makes the claim atomic), and selects frontends by inserting
 * (frontend, session) into kpr_trace_frontends; the value is the trace's
 * pid, so that a later trace can clear what a killed one left behind.
 * kpr_trace_on[0] is non-zero while any session exists: the hooks read it
 * first and look at nothing else while it is zero.
 */
#define TRACE_MAX_SESSIONS 8

struct trace_key {
	__u32 addr[4];	/* frontend address */
	__u16 port;	/* frontend port, network byte order; both protocols */
	__u8 session;
	__u8 pad;
};

/* One translation decision, as a ring buffer record. */
struct trace_event {
	__u64 time_ns;		/* bpf_ktime_get_ns() */
	__u64 socket_cookie;
	__u64 netns_cookie;
	__u32 pid;		/* thread group id; 0 without task helpers */
	__u8 comm[16];		/* empty without task helpers */
	__u32 frontend_addr[4];
	__u32 backend_addr[4];	/* zero unless translated */
	__u16 frontend_port;	/* network byte order */
	__u16 backend_port;	/* network byte order */
	__u8 proto;
	__u8 pad[3];
	enum sock_hook hook;
	enum sock_verdict verdict;
};
