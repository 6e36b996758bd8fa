//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket-level Service load balancing on the cgroup v2 sock_addr hooks.
 *
 * connect and sendmsg rewrite a Service frontend (VIP:port) to a backend
 * before the kernel routes anything, so no packet ever carries the VIP.
 * recvmsg and getpeername rewrite the backend back to the frontend, so the
 * application only ever sees the address it asked for.
 *
 * The maps are in maps.h, shared with kpr's other program objects
 * (sock_term.c); their types are in types.h.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "lb.h"

#define ECONNREFUSED 111

/* Set by the loader when the kernel lets cgroup programs choose the
 * syscall's errno (bpf_set_retval, 5.18+). Without it a rejected connect
 * fails with EPERM instead of ECONNREFUSED. */
volatile const __u8 have_set_retval = 0;

/* The scope the socket hooks look up. It is a constant rather than a literal
 * so that enum svc_scope reaches BTF, and from there bpf2go's Go bindings. */
volatile const enum svc_scope sock_scope = SVC_SCOPE_INTERNAL;

/* Cookie of the node's own (host) network namespace, set by the loader.
 * A loopback frontend (a NodePort on 127.0.0.1 or ::1) is a Service only
 * for sockets of that namespace: in a pod's namespace loopback is the
 * pod's own, as it is under kube-proxy, whose rules never see it. 0 (the
 * loader could not learn the cookie) serves loopback frontends to nobody. */
volatile const __u64 host_netns_cookie = 0;

/* Which sockets the hooks serve (--socket-lb). SOCK_LB_HOST_ONLY with no
 * host_netns_cookie would serve nobody; the loader refuses it. */
volatile const enum sock_lb_mode sock_lb_mode = SOCK_LB_ALL;

/* The pods the hooks leave to the packet path under SOCK_LB_PER_POD, by the
 * cookie of the pod's network namespace, which every container of a pod
 * shares: one helper call and one lookup, paid only by a syscall aimed at a
 * Service frontend. Pinned, so that a restarted kpr keeps bypassing the
 * same pods before its first sync. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);	/* network namespace cookie */
	__type(value, struct sock_bypass);
	__uint(max_entries, 4096);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_sock_bypass SEC(".maps");

/* Set by the loader when the kernel gives sock_addr programs the current
 * task's pid and comm (bpf_get_current_pid_tgid and _comm); without them
 * a trace event has neither. */
volatile const __u8 have_task_helpers = 0;

/* Per-hook counters (struct sock_stats, types.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);	/* enum sock_hook */
	__type(value, struct sock_stats);
	__uint(max_entries, SOCK_HOOK_COUNT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_sock_stats SEC(".maps");

/* The trace sessions of `kpr trace` (see struct trace_key in types.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);	/* non-zero while a session exists */
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_trace_on SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct trace_key);
	__type(value, __u32);	/* pid of the trace that selected it */
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_trace_frontends SEC(".maps");

/* Each session's ring buffer is its own, created by its trace: two traces
 * reading one ring buffer would each see only some of the records. */
struct trace_ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);	/* session */
	__uint(max_entries, TRACE_MAX_SESSIONS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct trace_ring);
} kpr_trace_rings SEC(".maps");

/*
 * bpf2go generates kpr's Go types from this object alone (the others use
 * -no-global-types), out of its BTF, and BTF holds only the types that
 * something in the object uses. These constants are that use for the two
 * types no map or program of this object has: the Service kind, which only
 * Go reads, and the key of sock_term.c's target map. Nothing reads them.
 */
volatile const enum svc_kind btf_svc_kind = SVC_KIND_CLUSTER_IP;
volatile const struct sock_term_key btf_sock_term_key = {};

enum lb_result {
	LB_NOT_SERVICE,	/* not a frontend: leave the address alone */
	LB_TRANSLATED,	/* the address now points at a backend */
	LB_REJECT,	/* a frontend without backends: fail the syscall */
	LB_BYPASSED,	/* a frontend, for a socket the hooks do not serve */
};

static __always_inline void addr_from_v6(__u32 addr[4], const struct bpf_sock_addr *ctx)
{
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
}

static __always_inline void count(enum sock_hook hook, enum sock_verdict verdict)
{
	__u32 key = hook;
	struct sock_stats *st = bpf_map_lookup_elem(&kpr_sock_stats, &key);

	/* Per CPU, so without atomics: only a program that preempts another
	 * on the same CPU can lose an increment, which a rate never shows. */
	if (st && verdict < SOCK_VERDICT_COUNT)
		st->count[verdict]++;
}

static __always_inline enum sock_verdict verdict_of(enum lb_result res)
{
	switch (res) {
	case LB_TRANSLATED:
		return SOCK_VERDICT_TRANSLATED;
	case LB_REJECT:
		return SOCK_VERDICT_REJECTED;
	case LB_BYPASSED:
		return SOCK_VERDICT_BYPASSED;
	default:
		return SOCK_VERDICT_PASSED;
	}
}

/* Offer ev to one session: write it to the session's ring buffer if the
 * session selected ev's frontend. *built says whether ev's client fields
 * are filled in yet: they cost helper calls, paid once and only for an
 * event that some session wants. */
static __always_inline void trace_offer(struct bpf_sock_addr *ctx, struct trace_event *ev,
					struct trace_key *key, __u32 session, int *built)
{
	void *ring;

	key->session = session;
	if (!bpf_map_lookup_elem(&kpr_trace_frontends, key))
		return;
	ring = bpf_map_lookup_elem(&kpr_trace_rings, &session);
	if (!ring)
		return;
	if (!*built) {
		ev->time_ns = bpf_ktime_get_ns();
		ev->socket_cookie = bpf_get_socket_cookie(ctx);
		ev->netns_cookie = bpf_get_netns_cookie(ctx);
		if (have_task_helpers) {
			ev->pid = bpf_get_current_pid_tgid() >> 32;
			bpf_get_current_comm(ev->comm, sizeof(ev->comm));
		}
		*built = 1;
	}
	/* A full ring drops the record: its reader is behind. */
	bpf_ringbuf_output(ring, ev, sizeof(*ev), 0);
}

/*
 * Out of line, so the hooks carry only the flag check in record(): this
 * runs only while a trace exists. The sessions are spelled out: the
 * verifier took clang's loop over them for an infinite one.
 */
static __noinline void trace_emit(struct bpf_sock_addr *ctx, struct trace_event *ev)
{
	struct trace_key key = {};
	int built = 0;

	addr_copy(key.addr, ev->frontend_addr);
	key.port = ev->frontend_port;
	_Static_assert(TRACE_MAX_SESSIONS == 8, "trace_emit offers to sessions 0..7");
	trace_offer(ctx, ev, &key, 0, &built);
	trace_offer(ctx, ev, &key, 1, &built);
	trace_offer(ctx, ev, &key, 2, &built);
	trace_offer(ctx, ev, &key, 3, &built);
	trace_offer(ctx, ev, &key, 4, &built);
	trace_offer(ctx, ev, &key, 5, &built);
	trace_offer(ctx, ev, &key, 6, &built);
	trace_offer(ctx, ev, &key, 7, &built);
}

/* Count the decision and, while any trace exists, offer it to them. */
static __always_inline void record(struct bpf_sock_addr *ctx, enum sock_hook hook,
				   enum lb_result res, const struct svc_key *frontend,
				   const struct backend *be)
{
	enum sock_verdict verdict = verdict_of(res);
	__u32 zero = 0, *on;

	count(hook, verdict);
	on = bpf_map_lookup_elem(&kpr_trace_on, &zero);
	if (!on || !*on)
		return;

	struct trace_event ev = {};

	addr_copy(ev.frontend_addr, frontend->addr);
	ev.frontend_port = frontend->port;
	ev.proto = frontend->proto;
	ev.hook = hook;
	ev.verdict = verdict;
	if (res == LB_TRANSLATED) {
		addr_copy(ev.backend_addr, be->addr);
		ev.backend_port = be->port;
	}
	trace_emit(ctx, &ev);
}

static __always_inline int reject(void)
{
	if (have_set_retval)
		bpf_set_retval(-ECONNREFUSED);
	return 0;
}

/* 127.0.0.0/8 (v4-mapped) or ::1, in network byte order. */
static __always_inline int is_loopback(const __u32 addr[4])
{
	if (addr[0] || addr[1])
		return 0;
	if (addr[2] == bpf_htonl(0xffff))
		return (bpf_ntohl(addr[3]) >> 24) == 127;
	return !addr[2] && addr[3] == bpf_htonl(1);
}

/* Loopback frontends serve only the node's own sockets (see
 * host_netns_cookie). */
static __always_inline int frontend_visible(struct bpf_sock_addr *ctx, const __u32 addr[4])
{
	if (!is_loopback(addr))
		return 1;
	return host_netns_cookie && bpf_get_netns_cookie(ctx) == host_netns_cookie;
}

/* Whether the hooks serve this socket (sock_lb_mode). The verifier prunes
 * the modes not loaded. */
static __always_inline int socket_served(struct bpf_sock_addr *ctx)
{
	__u64 netns;

	switch (sock_lb_mode) {
	case SOCK_LB_HOST_ONLY:
		return host_netns_cookie && bpf_get_netns_cookie(ctx) == host_netns_cookie;
	case SOCK_LB_PER_POD:
		netns = bpf_get_netns_cookie(ctx);
		return !bpf_map_lookup_elem(&kpr_sock_bypass, &netns);
	default:
		return 1;
	}
}

/* Remember the frontend for this socket and backend, unless already known:
 * an unconnected UDP socket calls sendmsg for every datagram. */
static __always_inline void sock_rev_remember(__u64 cookie, const struct backend *be,
					      const struct svc_key *frontend,
					      __u32 rev_nat_id)
{
	struct sock_rev_key key = {
		.cookie = cookie,
		.port = be->port,
	};
	struct sock_rev_value val = {
		.port = frontend->port,
		.rev_nat_id = rev_nat_id,
	};
	struct sock_rev_value *old;

	addr_copy(key.addr, be->addr);
	old = bpf_map_lookup_elem(&kpr_sock_rev, &key);
	if (old && old->rev_nat_id == rev_nat_id && old->port == frontend->port &&
	    old->addr[3] == frontend->addr[3] && old->addr[2] == frontend->addr[2] &&
	    old->addr[1] == frontend->addr[1] && old->addr[0] == frontend->addr[0])
		return;
	addr_copy(val.addr, frontend->addr);
	bpf_map_update_elem(&kpr_sock_rev, &key, &val, BPF_ANY);
}

/*
 * Look up the frontend in key and pick a backend for it. key->addr, port and
 * proto must be set; on LB_TRANSLATED *out points at the chosen backend.
 *
 * One socket keeps one backend: a UDP socket's slot is a function of its
 * cookie, so every datagram of an unconnected socket takes the same one.
 * A TCP socket picks once, at connect, so a random slot does.
 */
static __always_inline enum lb_result lb_select(struct bpf_sock_addr *ctx,
						struct svc_key *key,
						const struct backend **out)
{
	const struct svc_value *master;
	const struct backend *be = NULL;
	struct affinity_key client = {};
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__u32 backend_id = 0, pick;
	__u32 rev_nat_id;
	__u64 now = 0;

	key->scope = sock_scope;
	key->slot = 0;
	if (!frontend_visible(ctx, key->addr))
		return LB_NOT_SERVICE;
	master = bpf_map_lookup_elem(&kpr_services, key);
	if (!master)
		return LB_NOT_SERVICE;
	/* After the frontend lookup, so that only a syscall aimed at a
	 * Service pays for the check. A bypassed pod's connect to a Service
	 * without endpoints is left to the packet path too, which rejects it. */
	if (!socket_served(ctx))
		return LB_BYPASSED;
	if (master->count == 0)
		return LB_REJECT;

	if (master->affinity_timeout) {
		now = bpf_ktime_get_ns();
		client.client = bpf_get_netns_cookie(ctx);
		client.rev_nat_id = master->rev_nat_id;
		backend_id = lb_affinity_lookup(&kpr_affinity, &client, master, key->scope, now);
		if (backend_id)
			be = bpf_map_lookup_elem(&kpr_backends, &backend_id);
	}
	if (!be) {
		pick = key->proto == IPPROTO_UDP ? lb_hash64(cookie) : bpf_get_prandom_u32();
		be = lb_pick_slot(key, master, pick, &backend_id);
		if (!be)
			return LB_REJECT;
	}
	if (master->affinity_timeout)
		lb_affinity_update(&kpr_affinity, &client, backend_id, now);

	rev_nat_id = master->rev_nat_id;
	sock_rev_remember(cookie, be, key, rev_nat_id);
	*out = be;
	return LB_TRANSLATED;
}

static __always_inline int is_lb_proto(__u32 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

static __always_inline int forward4(struct bpf_sock_addr *ctx, enum sock_hook hook)
{
	struct svc_key key = {};
	const struct backend *be = NULL;
	enum lb_result res;

	if (!is_lb_proto(ctx->protocol)) {
		count(hook, SOCK_VERDICT_PASSED);
		return 1;
	}
	addr_from_v4(key.addr, ctx->user_ip4);
	key.port = (__u16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;

	res = lb_select(ctx, &key, &be);
	record(ctx, hook, res, &key, be);
	switch (res) {
	case LB_REJECT:
		return reject();
	case LB_TRANSLATED:
		ctx->user_ip4 = be->addr[3];
		ctx->user_port = be->port;
		return 1;
	default:
		return 1;
	}
}

static __always_inline int forward6(struct bpf_sock_addr *ctx, enum sock_hook hook)
{
	struct svc_key key = {};
	const struct backend *be = NULL;
	enum lb_result res;

	if (!is_lb_proto(ctx->protocol)) {
		count(hook, SOCK_VERDICT_PASSED);
		return 1;
	}
	addr_from_v6(key.addr, ctx);
	key.port = (__u16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;

	res = lb_select(ctx, &key, &be);
	record(ctx, hook, res, &key, be);
	switch (res) {
	case LB_REJECT:
		return reject();
	case LB_TRANSLATED:
		ctx->user_ip6[0] = be->addr[0];
		ctx->user_ip6[1] = be->addr[1];
		ctx->user_ip6[2] = be->addr[2];
		ctx->user_ip6[3] = be->addr[3];
		ctx->user_port = be->port;
		return 1;
	default:
		return 1;
	}
}

/* Find the frontend a socket was translated from, for a backend address. */
static __always_inline const struct sock_rev_value *
sock_rev_lookup(struct bpf_sock_addr *ctx, struct sock_rev_key *key)
{
	key->cookie = bpf_get_socket_cookie(ctx);
	key->port = (__u16)ctx->user_port;
	return bpf_map_lookup_elem(&kpr_sock_rev, key);
}

static __always_inline int reverse4(struct bpf_sock_addr *ctx, enum sock_hook hook)
{
	struct sock_rev_key key = {};
	const struct sock_rev_value *val;

	addr_from_v4(key.addr, ctx->user_ip4);
	val = sock_rev_lookup(ctx, &key);
	count(hook, val ? SOCK_VERDICT_TRANSLATED : SOCK_VERDICT_PASSED);
	if (val) {
		ctx->user_ip4 = val->addr[3];
		ctx->user_port = val->port;
	}
	return 1;
}

static __always_inline int reverse6(struct bpf_sock_addr *ctx, enum sock_hook hook)
{
	struct sock_rev_key key = {};
	const struct sock_rev_value *val;

	addr_from_v6(key.addr, ctx);
	val = sock_rev_lookup(ctx, &key);
	count(hook, val ? SOCK_VERDICT_TRANSLATED : SOCK_VERDICT_PASSED);
	if (val) {
		ctx->user_ip6[0] = val->addr[0];
		ctx->user_ip6[1] = val->addr[1];
		ctx->user_ip6[2] = val->addr[2];
		ctx->user_ip6[3] = val->addr[3];
		ctx->user_port = val->port;
	}
	return 1;
}

SEC("cgroup/connect4")
int kpr_connect4(struct bpf_sock_addr *ctx) { return forward4(ctx, SOCK_HOOK_CONNECT4); }

SEC("cgroup/connect6")
int kpr_connect6(struct bpf_sock_addr *ctx) { return forward6(ctx, SOCK_HOOK_CONNECT6); }

SEC("cgroup/sendmsg4")
int kpr_sendmsg4(struct bpf_sock_addr *ctx) { return forward4(ctx, SOCK_HOOK_SENDMSG4); }

SEC("cgroup/sendmsg6")
int kpr_sendmsg6(struct bpf_sock_addr *ctx) { return forward6(ctx, SOCK_HOOK_SENDMSG6); }

SEC("cgroup/recvmsg4")
int kpr_recvmsg4(struct bpf_sock_addr *ctx) { return reverse4(ctx, SOCK_HOOK_RECVMSG4); }

SEC("cgroup/recvmsg6")
int kpr_recvmsg6(struct bpf_sock_addr *ctx) { return reverse6(ctx, SOCK_HOOK_RECVMSG6); }

SEC("cgroup/getpeername4")
int kpr_getpeer4(struct bpf_sock_addr *ctx) { return reverse4(ctx, SOCK_HOOK_GETPEERNAME4); }

SEC("cgroup/getpeername6")
int kpr_getpeer6(struct bpf_sock_addr *ctx) { return reverse6(ctx, SOCK_HOOK_GETPEERNAME6); }

/* A closing socket forgets its reverse entry for the peer it was connected
 * to; entries of unconnected UDP sockets age out of the LRU map. */
SEC("cgroup/sock_release")
int kpr_sock_release(struct bpf_sock *sk)
{
	struct sock_rev_key key = {};

	key.cookie = bpf_get_socket_cookie(sk);
	if (sk->family == AF_INET) {
		addr_from_v4(key.addr, sk->dst_ip4);
	} else if (sk->family == AF_INET6) {
		key.addr[0] = sk->dst_ip6[0];
		key.addr[1] = sk->dst_ip6[1];
		key.addr[2] = sk->dst_ip6[2];
		key.addr[3] = sk->dst_ip6[3];
	} else {
		return 1;
	}
	key.port = (__u16)sk->dst_port;
	bpf_map_delete_elem(&kpr_sock_rev, &key);
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
