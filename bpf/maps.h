/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The pinned maps every kpr program object shares. Each object (each .c
 * file under bpf/) includes this header, so each object's ELF declares the
 * same maps with the same names, types and default sizes; the loader opens
 * or creates them once under the BPF root (LIBBPF_PIN_BY_NAME) and hands the
 * same maps to every object it loads. A map only one object uses and that
 * outlives no process belongs in that object's .c file instead.
 *
 * The default sizes here are what `kpr run` uses without --map-size-*.
 */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(max_entries, 131072);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct rev_nat_value);
	__uint(max_entries, 131072);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_rev_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_rev_key);
	__type(value, struct sock_rev_value);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_sock_rev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_affinity SEC(".maps");

/* Value unused: presence is the answer. Sized like kpr_services, since each
 * entry stands for one backend slot there. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct affinity_match_key);
	__type(value, __u8);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_affinity_match SEC(".maps");

/* Conntrack of the tc programs (struct ct_key in types.h): the flows that
 * have shown traffic both ways (kpr_ct_new holds the others). Pinned, so
 * flows survive a restart of kpr. Sized like kube-proxy's minimum
 * nf_conntrack_max; two entries per flow. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_conntrack SEC(".maps");

/* The entries of the tc programs' flows that have not shown traffic both
 * ways yet (ct.h, "Two maps"): a SYN flood churns this map's LRU, never
 * kpr_conntrack's. Pinned; sized by the loader's MapSizes.ConntrackNew.
 *
 * One LRU list per CPU (BPF_F_NO_COMMON_LRU): a CPU that needs room evicts
 * the oldest entries it inserted itself. With the common list, under a
 * flood that kept this map full, legitimate flows lost the entries they
 * had stored microseconds before their backend's SYN-ACK came back (seen
 * with tcpdump in the hostile benchmark: a few dozen connections a minute
 * waited out a SYN retransmission, or failed; none with a list per CPU).
 * The kernel splits max_entries evenly over the possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_ct_new SEC(".maps");

/* SNAT ports being taken over (nat.h, snat_take_over), keyed by the reply
 * entry's key: a CPU inserts its claim with BPF_NOEXIST before it looks at
 * the holder a last time and overwrites it, and deletes the claim at once,
 * so two CPUs never give one port to two new flows. An entry lives for a
 * few instructions; a claim that cannot be inserted (another CPU's, or a
 * full map) leaves the port to its holder. Seen in the hostile benchmark,
 * where two SYNs of a flood on two CPUs took one port, and the legitimate
 * flow among them lost its reply entry. Pinned, so that every device's
 * programs share the claims as they share the ports. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key);
	__type(value, __u32);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_snat_claims SEC(".maps");

/* IP fragments of the tc programs (struct frag_key in types.h): the ports
 * of each fragmented datagram's first fragment, for its later ones. An
 * entry is needed only while its datagram's fragments pass (well under the
 * kernel's 30s reassembly time), so the LRU map evicts the oldest; a
 * datagram whose entry is gone before its last fragment is counted
 * (nat_stats.fragment). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key);
	__type(value, struct frag_value);
	__uint(max_entries, 16384);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_frags SEC(".maps");

/* The tc programs' counters (struct nat_stats), one per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct nat_stats);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_tc_stats SEC(".maps");

/* ClientIP affinity of the tc programs (struct tc_affinity_key), one entry
 * per (client address, Service with affinity). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tc_affinity_key);
	__type(value, struct affinity_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_tc_affinity SEC(".maps");

/*
 * The node's secret for the tc programs' flow hash (flow_hash in pkt.h):
 * the random backend pick and the start of the SNAT port search use it, so
 * that an outsider cannot tell which backend or which SNAT port a flow of
 * his choosing gets. The loader fills entry 0 from crypto/rand when it
 * creates this map and adopts it afterwards: a kpr restart keeps it, and a
 * flow whose conntrack entry was evicted still picks what it picked before.
 * Maglev frontends use the cluster's seed instead (maglev_seed in
 * tc_nodeport.c), which every node shares.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_node_seed SEC(".maps");

/*
 * Maglev tables of the tc programs (struct maglev_key in types.h): the
 * backend of a new flow to a frontend that has one is
 * table[flow hash % maglev_table_size]. The control plane is the only
 * writer.
 *
 * Why a map of maps: a table must change as a whole. A flow picked from a
 * half-written table would go to a backend neither the old nor the new
 * table gives it, and another node, which read its table at another
 * moment, would pick differently. So each table is an array map of its
 * own, filled before it is published, and a change of the Service's
 * backends publishes a new array by one update of its entry here, which
 * the kernel makes atomically (a lookup sees the old array or the new
 * one). Frontends with the same backends share one array.
 *
 * BPF_F_INNER_MAP lets the arrays have any size: the size is a flag of
 * kpr run, and a kpr started with another size replaces the tables
 * without this pinned map having to change. The 16381 below is only the
 * template's size.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, struct maglev_key);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__type(key, __u32);
		__type(value, __u32);	/* backend id in kpr_backends */
		__uint(max_entries, 16381);
		__uint(map_flags, BPF_F_INNER_MAP);
	});
} kpr_maglev SEC(".maps");

/* loadBalancerSourceRanges (struct src_range_key in types.h). Value unused:
 * presence is the answer. Only masters with SVC_F_SOURCE_RANGES are looked
 * up here, so Services without ranges pay nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_range_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} kpr_src_ranges SEC(".maps");
