//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket termination: kpr_sock_term_udp, a UDP socket iterator, destroys
 * connected UDP sockets whose backend left the Service they were translated
 * from, so that their owners reconnect to a live backend.
 *
 * It is an object of its own because it runs only where the kernel can run
 * it (iter/udp and bpf_sock_destroy, Linux 6.5+): the loader loads it apart
 * from the socket hooks of sock_lb.c, against the same pinned kpr_sock_rev
 * (maps.h), and a kernel without it still gets every hook.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "types.h"
#include "maps.h"
#include "addr.h"
#include "kernel.h"

/* The control plane's list of (frontend, removed backend) pairs for one run
 * of kpr_sock_term_udp. Not pinned: only the running control plane uses it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct sock_term_key);
	__type(value, __u8);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} kpr_sock_term SEC(".maps");

/* Linux 6.5+; the loader loads this object only where the kernel has it. */
extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/*
 * Runs once per UDP socket of the network namespace the iterator was opened
 * in. A connected socket is destroyed when kpr translated it (kpr_sock_rev
 * has its cookie and peer) from a frontend to a backend that kpr_sock_term
 * lists as removed from that frontend. Sockets connected to a pod IP
 * directly, or to a backend that stays, are never touched. The destroyed
 * socket's owner sees ECONNABORTED and reconnects to a live backend. The
 * cookie of every destroyed socket is written to the iterator's output.
 */
SEC("iter/udp")
int kpr_sock_term_udp(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;
	struct sock_rev_key rev_key = {};
	struct sock_term_key term = {};
	const struct sock_rev_value *rev;
	__u16 family;
	__u64 cookie;

	if (!sk)
		return 0;
	rev_key.port = sk->__sk_common.skc_dport;
	if (!rev_key.port)
		return 0; /* not connected */
	family = sk->__sk_common.skc_family;
	if (family == AF_INET) {
		addr_from_v4(rev_key.addr, sk->__sk_common.skc_daddr);
	} else if (family == AF_INET6) {
		rev_key.addr[0] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0];
		rev_key.addr[1] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1];
		rev_key.addr[2] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2];
		rev_key.addr[3] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
	} else {
		return 0;
	}
	cookie = bpf_get_socket_cookie(sk);
	rev_key.cookie = cookie;
	rev = bpf_map_lookup_elem(&kpr_sock_rev, &rev_key);
	if (!rev)
		return 0; /* kpr did not send this socket where it is connected */

	addr_copy(term.backend_addr, rev_key.addr);
	term.backend_port = rev_key.port;
	addr_copy(term.frontend_addr, rev->addr);
	term.frontend_port = rev->port;
	if (!bpf_map_lookup_elem(&kpr_sock_term, &term))
		return 0;

	if (bpf_sock_destroy((struct sock_common *)sk))
		return 0;
	/* The socket is disconnected now, so sock_release could no longer
	 * find this entry. */
	bpf_map_delete_elem(&kpr_sock_rev, &rev_key);
	bpf_seq_write(ctx->meta->seq, &cookie, sizeof(cookie));
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
