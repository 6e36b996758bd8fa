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
 * the internal one), picks a backend, records the flow in kpr_conntrack and
 * rewrites the destination (DNAT); the kernel then routes the packet to the
 * backend. kpr_tc_egress finds the backend's replies in kpr_conntrack and
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
 * The maps are those of maps.h, shared with the other objects.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/stddef.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "maps.h"
#include "addr.h"

#define NSEC_PER_SEC 1000000000ULL

/* A packet kpr lets through, translated or not, goes on to the next program
 * on the device (TCX_NEXT for tcx, the next filter for clsact), and is
 * passed when there is none: kpr shares the device with other tools. */
#define TC_PASS TC_ACT_UNSPEC

/*
 * Conntrack lifetimes in seconds, set by the loader. The defaults are the
 * netfilter timeouts kube-proxy runs with: SYN_SENT, established (kube-proxy's
 * --conntrack-tcp-timeout-established), TIME_WAIT after a FIN, CLOSE after a
 * RST, and UDP before and after a reply (udp_timeout, udp_timeout_stream).
 */
volatile const __u32 ct_tcp_syn_s = 120;
volatile const __u32 ct_tcp_established_s = 86400;
volatile const __u32 ct_tcp_fin_s = 120;
volatile const __u32 ct_tcp_rst_s = 10;
volatile const __u32 ct_udp_s = 30;
volatile const __u32 ct_udp_stream_s = 120;

/* The source ports SNATed flows get, host byte order, set by the loader.
 * Above the kernel's default ephemeral range (32768-60999), so that they
 * do not meet the node's own connections to the same backend. */
volatile const __u16 snat_port_min = 61000;
volatile const __u16 snat_port_max = 65535;

/* The size of every Maglev table in kpr_maglev (a prime), set by the
 * loader from --maglev-table-size. */
volatile const __u32 maglev_table_size = 16381;

/* How many ports a new SNATed flow tries before it is dropped. */
#define SNAT_TRIES 16

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

/* The conntrack enums reach BTF only through a use of their type: these
 * constants are that use, so that Go can check its copies of the values
 * (maps/conntrack.go) against this object. Nothing reads them. */
volatile const enum ct_dir btf_ct_dir = CT_DIR_FORWARD;
volatile const enum ct_flags btf_ct_flags = CT_F_REPLIED;
volatile const enum svc_flags btf_svc_flags = SVC_F_SOURCE_RANGES;

/* A flow's lifetime is written back only when it gains at least this much,
 * so an established flow does not write its entry on every packet. */
#define CT_REFRESH_NS NSEC_PER_SEC

/* From linux/icmp.h and linux/icmpv6.h, which pull in libc headers. */
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* The parts of a packet the programs look at. Ports in network order. */
struct pkt {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u32 l3_off;
	__u32 l4_off;
	__u8 proto;
	__u8 tcp_flags;
	__u8 v6;
};

#define STAT_INC(field)                                                \
	do {                                                           \
		__u32 zero = 0;                                        \
		struct nat_stats *s = bpf_map_lookup_elem(&kpr_tc_stats, &zero); \
		if (s)                                                 \
			s->field++;                                    \
	} while (0)

/* The headers parse reads: Ethernet, IPv4 with the longest options (or
 * IPv6), and TCP up to its flags. */
#define PARSE_LEN (ETH_HLEN + 60 + 14)

#define PARSED_L4 1
#define PARSED_ICMP 2

/* Parse an Ethernet frame carrying IPv4 or IPv6 with TCP or UDP
 * (PARSED_L4), reading the headers in place, or ICMP (PARSED_ICMP: only the
 * IP header is parsed). Returns 0 for anything else, and for IPv4 fragments
 * (counted): a non-first fragment has no ports to look up. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *l4;

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
		if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP &&
		    ip->protocol != IPPROTO_ICMP)
			return 0;
		if (ip->frag_off & bpf_htons(0x3fff)) { /* MF or an offset */
			STAT_INC(fragment);
			return 0;
		}
		p->proto = ip->protocol;
		addr_from_v4(p->saddr, ip->saddr);
		addr_from_v4(p->daddr, ip->daddr);
		p->l4_off = ETH_HLEN + ip->ihl * 4;
		p->v6 = 0;
		l4 = (__u8 *)ip + ip->ihl * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end)
			return 0;
		/* Extension headers are not followed: no Service traffic
		 * carries them in practice, and kpr leaves such packets be. */
		if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP &&
		    ip6->nexthdr != IPPROTO_ICMPV6)
			return 0;
		p->proto = ip6->nexthdr;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		p->l4_off = ETH_HLEN + sizeof(*ip6);
		p->v6 = 1;
		l4 = (__u8 *)(ip6 + 1);
	} else {
		return 0;
	}
	if (p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6)
		return PARSED_ICMP;
	if (l4 + 4 > (__u8 *)data_end)
		return 0;
	__builtin_memcpy(&p->sport, l4, 2);
	__builtin_memcpy(&p->dport, l4 + 2, 2);
	p->tcp_flags = 0;
	if (p->proto == IPPROTO_TCP) {
		if (l4 + 14 > (__u8 *)data_end)
			return 0;
		p->tcp_flags = l4[13];
	}
	return 1;
}

/*
 * Rewrite one address and port of the packet: the destination (dst != 0)
 * or the source. The IPv4 header checksum and the TCP or UDP checksum
 * (whose pseudo-header holds the address) are fixed incrementally; a UDP
 * checksum of 0 (none, IPv4 only) stays 0. Returns 0 on success.
 */
static __always_inline int rewrite(struct __sk_buff *skb, const struct pkt *p, int dst,
				   const __u32 old_addr[4], const __u32 new_addr[4],
				   __u16 old_port, __u16 new_port)
{
	__u32 csum_off = p->l4_off + (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							      : offsetof(struct udphdr, check));
	__u32 port_off = p->l4_off + (dst ? 2 : 0);
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u32 addr_off;
	__s64 diff;

	if (p->v6) {
		addr_off = p->l3_off + (dst ? offsetof(struct ipv6hdr, daddr)
					    : offsetof(struct ipv6hdr, saddr));
		diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0)
			return -1;
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | l4_flags))
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, new_addr, 16, 0))
			return -1;
	} else {
		addr_off = p->l3_off + (dst ? offsetof(struct iphdr, daddr)
					    : offsetof(struct iphdr, saddr));
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check),
					old_addr[3], new_addr[3], 4))
			return -1;
		if (bpf_l4_csum_replace(skb, csum_off, old_addr[3], new_addr[3],
					BPF_F_PSEUDO_HDR | l4_flags | 4))
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &new_addr[3], 4, 0))
			return -1;
	}
	if (old_port != new_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, new_port, l4_flags | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0))
			return -1;
	}
	return 0;
}

/* How long a flow lives after a packet, given what it has shown. */
static __always_inline __u64 ct_lifetime_ns(__u8 proto, __u8 flags)
{
	__u32 s;

	if (proto == IPPROTO_TCP) {
		if (flags & CT_F_RST)
			s = ct_tcp_rst_s;
		else if (flags & CT_F_FIN)
			s = ct_tcp_fin_s;
		else if (flags & CT_F_REPLIED)
			s = ct_tcp_established_s;
		else
			s = ct_tcp_syn_s;
	} else {
		s = (flags & CT_F_REPLIED) ? ct_udp_stream_s : ct_udp_s;
	}
	return (__u64)s * NSEC_PER_SEC;
}

static __always_inline __u8 tcp_close_flags(__u8 tcp_flags)
{
	return (tcp_flags & TCP_FLAG_RST ? CT_F_RST : 0) | (tcp_flags & TCP_FLAG_FIN ? CT_F_FIN : 0);
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
 * holds the flow's port: the allocator takes over only expired ones.
 */
static __always_inline void ct_touch(struct ct_value *ct, const __u32 client[4], __u16 client_port,
				     __u8 proto, __u8 new_flags, __u64 now)
{
	struct ct_key rkey = {};
	struct ct_value *rev;
	__u64 expires;

	if ((ct->flags | new_flags) != ct->flags)
		ct->flags |= new_flags;
	expires = now + ct_lifetime_ns(proto, ct->flags);
	/* A RST or FIN shortens the lifetime, which must be written now. */
	if (expires <= ct->expires_ns + CT_REFRESH_NS && !(new_flags & (CT_F_RST | CT_F_FIN)))
		return;
	ct->expires_ns = expires;
	if (!(ct->flags & CT_F_SNAT))
		return;
	ct_reply_key(&rkey, ct, client, client_port, proto);
	rev = bpf_map_lookup_elem(&kpr_conntrack, &rkey);
	if (rev)
		rev->expires_ns = expires;
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

/* splitmix64's finalizer: every output bit depends on every input bit. */
static __always_inline __u32 mix64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return (__u32)x;
}

/* The backend slot of a new flow is a function of the flow: should its
 * conntrack entry be lost (evicted from the LRU map), its next packet picks
 * the same backend while the Service's backends stay the same. */
static __always_inline __u32 flow_hash(const struct pkt *p)
{
	__u64 a = ((__u64)(p->saddr[0] ^ p->saddr[2]) << 32) | (p->saddr[1] ^ p->saddr[3]);
	__u64 b = ((__u64)p->sport << 16 | p->dport) ^ ((__u64)p->proto << 32);

	return mix64(a ^ mix64(b));
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

/*
 * Store the reply entry of a SNATed flow under a free port of the SNAT
 * range: the flow's hash picks where to start, and taken ports are skipped.
 * A port whose holder expired is taken over. Returns the port (network
 * order) in rkey->dport, or -1 when none of SNAT_TRIES was free.
 */
static __always_inline int snat_store(const struct pkt *p, struct ct_key *rkey,
				      const struct ct_value *rev, __u64 now)
{
	__u32 range = (__u32)snat_port_max - snat_port_min + 1;
	__u32 start = flow_hash(p);
	const struct ct_value *old;
	int i;

	for (i = 0; i < SNAT_TRIES; i++) {
		rkey->dport = bpf_htons((__u16)(snat_port_min + (start + i) % range));
		if (!bpf_map_update_elem(&kpr_conntrack, rkey, rev, BPF_NOEXIST))
			return 0;
		old = bpf_map_lookup_elem(&kpr_conntrack, rkey);
		if (old && now > old->expires_ns &&
		    !bpf_map_update_elem(&kpr_conntrack, rkey, rev, BPF_EXIST))
			return 0;
	}
	return -1;
}

/* The backend this client last used for the Service, if the affinity has
 * not timed out and that backend still serves the Service in this scope;
 * else 0. */
static __always_inline __u32 tc_affinity_lookup(const struct pkt *p, const struct svc_value *master,
						__u8 scope, __u64 now)
{
	struct tc_affinity_key key = {.rev_nat_id = master->rev_nat_id, .scope = scope};
	struct affinity_match_key match = {.rev_nat_id = master->rev_nat_id, .scope = scope};
	const struct affinity_value *val;

	addr_copy(key.client, p->saddr);
	val = bpf_map_lookup_elem(&kpr_tc_affinity, &key);
	if (!val || now - val->last_used_ns > (__u64)master->affinity_timeout * NSEC_PER_SEC)
		return 0;
	match.backend_id = val->backend_id;
	if (!bpf_map_lookup_elem(&kpr_affinity_match, &match))
		return 0;
	return match.backend_id;
}

static __always_inline void tc_affinity_update(const struct pkt *p, const struct svc_value *master,
					       __u8 scope, __u32 backend_id, __u64 now)
{
	struct tc_affinity_key key = {.rev_nat_id = master->rev_nat_id, .scope = scope};
	struct affinity_value val = {.last_used_ns = now, .backend_id = backend_id};

	addr_copy(key.client, p->saddr);
	bpf_map_update_elem(&kpr_tc_affinity, &key, &val, BPF_ANY);
}

/*
 * The backend the frontend's Maglev table gives a new flow, or 0 when the
 * frontend has no table (--lb-algorithm random). The flow hash leaves out
 * the destination address, so a NodePort reached at either node's address
 * picks alike too; and it is a function of the packet alone, so every node
 * with the same table picks the same backend. A table of another size (a
 * kpr restarted with another --maglev-table-size, until the control plane
 * replaces its tables) still names a backend of the Service, or nothing
 * past its end: those flows take the random pick meanwhile.
 */
static __always_inline __u32 maglev_backend(const struct pkt *p, const struct svc_value *master, __u8 scope)
{
	struct maglev_key key = {.rev_nat_id = master->rev_nat_id, .scope = scope};
	const __u32 *id;
	void *table;
	__u32 slot;

	table = bpf_map_lookup_elem(&kpr_maglev, &key);
	if (!table)
		return 0;
	slot = flow_hash(p) % maglev_table_size;
	id = bpf_map_lookup_elem(table, &slot);
	return id ? *id : 0;
}

/* Whether the frontend picks backends by a Maglev table. */
static __always_inline int has_maglev(const struct svc_value *master, __u8 scope)
{
	struct maglev_key key = {.rev_nat_id = master->rev_nat_id, .scope = scope};

	return bpf_map_lookup_elem(&kpr_maglev, &key) != NULL;
}

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
	struct ct_value rev = {};
	const struct svc_value *slot;
	const struct backend *be;
	__u32 backend_id;
	int err;

	if (master->count == 0) {
		STAT_INC(drop_no_backend);
		return -1;
	}
	be = NULL;
	if (master->affinity_timeout) {
		backend_id = tc_affinity_lookup(p, master, skey->scope, now);
		if (backend_id)
			be = bpf_map_lookup_elem(&kpr_backends, &backend_id);
		if (be)
			STAT_INC(affinity_hit);
	}
	/* ClientIP affinity wins; then the Maglev table, if the frontend has
	 * one and its backend is still there; then the backend slots. */
	if (!be) {
		backend_id = maglev_backend(p, master, skey->scope);
		if (backend_id)
			be = bpf_map_lookup_elem(&kpr_backends, &backend_id);
	}
	if (!be) {
		skey->slot = (flow_hash(p) % master->count) + 1;
		slot = bpf_map_lookup_elem(&kpr_services, skey);
		skey->slot = 0;
		if (!slot) {
			STAT_INC(drop_no_backend);
			return -1;
		}
		backend_id = slot->backend_id;
		be = bpf_map_lookup_elem(&kpr_backends, &backend_id);
		if (!be) {
			STAT_INC(drop_no_backend);
			return -1;
		}
	}
	if (master->affinity_timeout)
		tc_affinity_update(p, master, skey->scope, backend_id, now);

	addr_copy(fwd->addr, be->addr);
	fwd->port = be->port;
	fwd->backend_id = backend_id;
	fwd->rev_nat_id = master->rev_nat_id;
	fwd->flags = tcp_close_flags(p->tcp_flags);
	/* externalTrafficPolicy: Local (the external scope) keeps the
	 * client's address. */
	if (skey->scope == SVC_SCOPE_INTERNAL && backend_remote(skb, p, be, fwd->nat_addr))
		fwd->flags |= CT_F_SNAT;
	fwd->expires_ns = now + ct_lifetime_ns(p->proto, fwd->flags);

	addr_copy(rev.addr, p->daddr);
	rev.port = p->dport;
	rev.backend_id = backend_id;
	rev.rev_nat_id = master->rev_nat_id;
	rev.expires_ns = fwd->expires_ns;
	rev.flags = fwd->flags & CT_F_SNAT;
	if (fwd->flags & CT_F_SNAT) {
		addr_copy(rev.nat_addr, p->saddr);
		rev.nat_port = p->sport;
		ct_reply_key(&rkey, fwd, p->saddr, p->sport, p->proto);
		if (snat_store(p, &rkey, &rev, now)) {
			STAT_INC(drop_snat_ports);
			return -1;
		}
		fwd->nat_port = rkey.dport;
		STAT_INC(snat);
	} else {
		ct_reply_key(&rkey, fwd, p->saddr, p->sport, p->proto);
		if (bpf_map_update_elem(&kpr_conntrack, &rkey, &rev, BPF_ANY)) {
			STAT_INC(drop_ct_insert);
			return -1;
		}
	}
	err = bpf_map_update_elem(&kpr_conntrack, fkey, fwd, BPF_ANY);
	if (err) {
		bpf_map_delete_elem(&kpr_conntrack, &rkey);
		STAT_INC(drop_ct_insert);
		return -1;
	}
	STAT_INC(new_flows);
	return 0;
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
 * A reply passed: the forward entry learns of the first one (the flow is
 * established) and of a FIN or RST, which shorten its lifetime. rev is the
 * reply entry, from its copy; client the flow's client.
 */
static __always_inline void note_reply(struct ct_value *rev, const struct ct_value *from,
				       const struct pkt *p, const __u32 client[4], __u16 client_port)
{
	struct ct_key fkey = {};
	struct ct_value *fwd;
	__u8 flags = tcp_close_flags(p->tcp_flags);

	if ((rev->flags & CT_F_REPLIED) && !flags)
		return;
	rev->flags |= CT_F_REPLIED;
	ct_key_of(&fkey, client, client_port, from->addr, from->port, p->proto, CT_DIR_FORWARD);
	fwd = bpf_map_lookup_elem(&kpr_conntrack, &fkey);
	if (fwd)
		ct_touch(fwd, client, client_port, p->proto, flags | CT_F_REPLIED, bpf_ktime_get_ns());
}

static __always_inline int snat_port(__u16 port)
{
	__u16 h = bpf_ntohs(port);

	return h >= snat_port_min && h <= snat_port_max;
}

/* Ingress: a reply of a SNATed flow, from the backend on another node to
 * the node address and port the flow was given. Returns -1 when the packet
 * is no such reply. */
static __always_inline int snat_reply(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key rkey = {};
	struct ct_value *rev;
	struct ct_value from;

	ct_key_of(&rkey, p->saddr, p->sport, p->daddr, p->dport, p->proto, CT_DIR_REPLY);
	rev = bpf_map_lookup_elem(&kpr_conntrack, &rkey);
	if (!rev || !(rev->flags & CT_F_SNAT))
		return -1;
	from = *rev;
	note_reply(rev, &from, p, from.nat_addr, from.nat_port);
	/* To the client, from the frontend. */
	if (rewrite(skb, p, 1, p->daddr, from.nat_addr, p->dport, from.nat_port) ||
	    rewrite(skb, p, 0, p->saddr, from.addr, p->sport, from.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(reversed);
	return fib_redirect(skb, p, from.addr, from.nat_addr);
}

static __always_inline int addr_eq(const __u32 a[4], const __u32 b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/*
 * The packet an ICMP error is about: destination unreachable (which
 * carries "fragmentation needed" and "packet too big") or time exceeded,
 * quoting an IP header and the first 8 bytes of TCP or UDP. Read with
 * bpf_skb_load_bytes: this is not the hot path. Returns 0 for any other
 * ICMP message.
 */
static __always_inline int parse_icmp_error(struct __sk_buff *skb, const struct pkt *p, struct pkt *in)
{
	__u8 type, ports[4];

	if (bpf_skb_load_bytes(skb, p->l4_off, &type, 1))
		return 0;
	if (p->v6 ? type != ICMPV6_DEST_UNREACH && type != ICMPV6_PKT_TOOBIG && type != ICMPV6_TIME_EXCEED
		  : type != ICMP_DEST_UNREACH && type != ICMP_TIME_EXCEEDED)
		return 0;
	in->l3_off = p->l4_off + 8;
	in->v6 = p->v6;
	if (!p->v6) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, in->l3_off, &ip, sizeof(ip)) || ip.version != 4 || ip.ihl < 5)
			return 0;
		in->proto = ip.protocol;
		addr_from_v4(in->saddr, ip.saddr);
		addr_from_v4(in->daddr, ip.daddr);
		in->l4_off = in->l3_off + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, in->l3_off, &ip6, sizeof(ip6)))
			return 0;
		in->proto = ip6.nexthdr;
		__builtin_memcpy(in->saddr, &ip6.saddr, 16);
		__builtin_memcpy(in->daddr, &ip6.daddr, 16);
		in->l4_off = in->l3_off + sizeof(ip6);
	}
	if (in->proto != IPPROTO_TCP && in->proto != IPPROTO_UDP)
		return 0;
	if (bpf_skb_load_bytes(skb, in->l4_off, ports, sizeof(ports)))
		return 0;
	__builtin_memcpy(&in->sport, &ports[0], 2);
	__builtin_memcpy(&in->dport, &ports[2], 2);
	return 1;
}

/* Rewrite the source (dst == 0) or destination address of an ICMP
 * message's own IP header; ICMPv6 has it in its checksum's pseudo-header. */
static __always_inline int rewrite_icmp_outer(struct __sk_buff *skb, const struct pkt *p, int dst,
					      const __u32 old_addr[4], const __u32 new_addr[4])
{
	__s64 diff;

	if (p->v6) {
		diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, p->l4_off + 2, 0, diff, BPF_F_PSEUDO_HDR))
			return -1;
		return bpf_skb_store_bytes(skb, p->l3_off + (dst ? offsetof(struct ipv6hdr, daddr)
								 : offsetof(struct ipv6hdr, saddr)),
					   new_addr, 16, 0) ? -1 : 0;
	}
	if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), old_addr[3], new_addr[3], 4))
		return -1;
	return bpf_skb_store_bytes(skb, p->l3_off + (dst ? offsetof(struct iphdr, daddr)
							 : offsetof(struct iphdr, saddr)),
				   &new_addr[3], 4, 0) ? -1 : 0;
}

/*
 * Rewrite the source (dst == 0) or destination address and port of the
 * packet an ICMP error quotes. The quoted IPv4 header checksum and the ICMP
 * checksum, which covers the quote, are fixed; the quoted TCP or UDP
 * checksum is left as it is, since receivers of ICMP errors ignore it.
 */
static __always_inline int rewrite_quoted(struct __sk_buff *skb, const struct pkt *p, const struct pkt *in,
					  int dst, const __u32 old_addr[4], const __u32 new_addr[4],
					  __u16 old_port, __u16 new_port)
{
	__u32 icmp_csum = p->l4_off + 2;
	__s64 diff;

	if (in->v6) {
		diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, icmp_csum, 0, diff, 0))
			return -1;
		if (bpf_skb_store_bytes(skb, in->l3_off + (dst ? offsetof(struct ipv6hdr, daddr)
								: offsetof(struct ipv6hdr, saddr)),
					new_addr, 16, 0))
			return -1;
	} else {
		__u32 check_off = in->l3_off + offsetof(struct iphdr, check);
		__u16 old_check, new_check;

		if (bpf_skb_load_bytes(skb, check_off, &old_check, 2) ||
		    bpf_l3_csum_replace(skb, check_off, old_addr[3], new_addr[3], 4) ||
		    bpf_skb_load_bytes(skb, check_off, &new_check, 2))
			return -1;
		if (bpf_l4_csum_replace(skb, icmp_csum, old_addr[3], new_addr[3], 4) ||
		    bpf_l4_csum_replace(skb, icmp_csum, old_check, new_check, 2))
			return -1;
		if (bpf_skb_store_bytes(skb, in->l3_off + (dst ? offsetof(struct iphdr, daddr)
								: offsetof(struct iphdr, saddr)),
					&new_addr[3], 4, 0))
			return -1;
	}
	if (old_port == new_port)
		return 0;
	if (bpf_l4_csum_replace(skb, icmp_csum, old_port, new_port, 2))
		return -1;
	return bpf_skb_store_bytes(skb, in->l4_off + (dst ? 2 : 0), &new_port, 2, 0) ? -1 : 0;
}

/*
 * Ingress: an ICMP error about a packet of a translated flow, so that path
 * MTU discovery works through a NodePort. Either about a reply kpr sent to
 * the client (quoting frontend -> client, from somewhere on the path to the
 * client): it goes to the backend, about the packet as the backend sent it
 * (from the node's SNAT address and port, for a SNATed flow). Or, for a
 * SNATed flow, about a packet kpr sent to the backend on another node
 * (quoting node -> backend): it goes to the client, about the packet the
 * client sent. The kernel routes the translated error on.
 */
static __always_inline int icmp_ingress(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key key = {};
	const struct ct_value *ct;
	struct ct_value e;
	struct pkt in = {};
	int err;

	if (!parse_icmp_error(skb, p, &in))
		return TC_PASS;
	ct_key_of(&key, in.daddr, in.dport, in.saddr, in.sport, in.proto, CT_DIR_FORWARD);
	ct = bpf_map_lookup_elem(&kpr_conntrack, &key);
	if (ct) {
		e = *ct;
		err = (addr_eq(p->daddr, in.saddr) && rewrite_icmp_outer(skb, p, 1, p->daddr, e.addr)) ||
		      rewrite_quoted(skb, p, &in, 0, in.saddr, e.addr, in.sport, e.port);
		if (!err && (e.flags & CT_F_SNAT))
			err = rewrite_quoted(skb, p, &in, 1, in.daddr, e.nat_addr, in.dport, e.nat_port);
	} else {
		key.dir = CT_DIR_REPLY;
		ct = bpf_map_lookup_elem(&kpr_conntrack, &key);
		if (!ct || !(ct->flags & CT_F_SNAT))
			return TC_PASS;
		e = *ct; /* nat_addr:nat_port is the client, addr:port the frontend */
		err = (addr_eq(p->daddr, in.saddr) && rewrite_icmp_outer(skb, p, 1, p->daddr, e.nat_addr)) ||
		      rewrite_quoted(skb, p, &in, 0, in.saddr, e.nat_addr, in.sport, e.nat_port) ||
		      rewrite_quoted(skb, p, &in, 1, in.daddr, e.addr, in.dport, e.port);
	}
	if (err) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(icmp_translated);
	return TC_PASS;
}

/*
 * Egress: an ICMP error toward a client about its packet to a local backend
 * (quoting client -> backend, as it was after the DNAT): from this node's
 * forwarding (fragmentation needed on the way to the pod), or from the
 * backend itself, whose address then leaves as the frontend's too.
 */
static __always_inline int icmp_egress(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key rkey = {};
	const struct ct_value *rev;
	struct ct_value from;
	struct pkt in = {};

	if (!parse_icmp_error(skb, p, &in))
		return TC_PASS;
	ct_key_of(&rkey, in.daddr, in.dport, in.saddr, in.sport, in.proto, CT_DIR_REPLY);
	rev = bpf_map_lookup_elem(&kpr_conntrack, &rkey);
	if (!rev || (rev->flags & CT_F_SNAT))
		return TC_PASS;
	from = *rev;
	if ((addr_eq(p->saddr, in.daddr) && rewrite_icmp_outer(skb, p, 0, p->saddr, from.addr)) ||
	    rewrite_quoted(skb, p, &in, 1, in.daddr, from.addr, in.dport, from.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(icmp_translated);
	return TC_PASS;
}

SEC("tc")
int kpr_tc_ingress(struct __sk_buff *skb)
{
	struct ct_key fkey = {};
	struct svc_key skey = {};
	struct ct_value to = {};
	const struct svc_value *master;
	struct ct_value *ct;
	struct pkt p = {};
	__u64 now;
	int ret;

	ret = parse(skb, &p);
	if (ret == PARSED_ICMP)
		return icmp_ingress(skb, &p);
	if (ret != PARSED_L4)
		return TC_PASS;
	if (snat_port(p.dport)) {
		ret = snat_reply(skb, &p);
		if (ret != -1)
			return ret;
	}

	ct_key_of(&fkey, p.saddr, p.sport, p.daddr, p.dport, p.proto, CT_DIR_FORWARD);

	now = bpf_ktime_get_ns();
	ct = bpf_map_lookup_elem(&kpr_conntrack, &fkey);
	if (ct && ct_usable(ct, &p, now)) {
		ct_touch(ct, p.saddr, p.sport, p.proto, tcp_close_flags(p.tcp_flags), now);
		to = *ct;
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
		/* Only a SYN opens a TCP flow. Another segment belongs to a
		 * connection kpr never saw, such as one made through kube-proxy's
		 * NAT before kpr took over the node, which the kernel's conntrack
		 * still carries; a random pick would send it to a backend that
		 * answers with a reset. A Maglev frontend picks the flow's
		 * backend again instead: that is how a flow survives moving to
		 * another node behind an ECMP router. */
		if (p.proto == IPPROTO_TCP && !(p.tcp_flags & TCP_FLAG_SYN) && !has_maglev(master, skey.scope)) {
			STAT_INC(midstream);
			return TC_PASS;
		}
		if (ct_create(skb, &p, &fkey, &skey, master, &to, now))
			return TC_ACT_SHOT;
	}
	if (rewrite(skb, &p, 1, p.daddr, to.addr, p.dport, to.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(translated);
	if (!(to.flags & CT_F_SNAT))
		return TC_PASS; /* a local backend: the kernel routes it there */
	if (rewrite(skb, &p, 0, p.saddr, to.nat_addr, p.sport, to.nat_port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	return fib_redirect(skb, &p, to.nat_addr, to.addr);
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
	rev = bpf_map_lookup_elem(&kpr_conntrack, &rkey);
	if (!rev || (rev->flags & CT_F_SNAT))
		return TC_PASS;
	/* A copy: the forward lookup below may evict the entry rev points to. */
	from = *rev;
	note_reply(rev, &from, &p, p.daddr, p.dport);

	if (rewrite(skb, &p, 0, p.saddr, from.addr, p.sport, from.port)) {
		STAT_INC(drop_rewrite);
		return TC_ACT_SHOT;
	}
	STAT_INC(reversed);
	return TC_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
