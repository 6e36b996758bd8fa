/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The load-balancing core of both program objects: the socket hooks
 * (sock_lb.c) and the tc programs (tc_nodeport.c) pick a Service's backend
 * the same way, and differ only in what names the client. At the socket it
 * is the socket cookie and the network namespace; at tc, the flow's
 * addresses and ports. So the client's hash, and its affinity map and key,
 * are parameters here.
 *
 * Nothing here defines a map or a variable: an object that includes this
 * gets only the code it calls, and its ELF and Go bindings stay its own.
 */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "types.h"
#include "maps.h"

/*
 * A 64-bit finalizer (splitmix64's): every output bit depends on every
 * input bit. What the callers hash steps in patterns: socket cookies are
 * handed out in sequence, and clients often open sockets in pairs or larger
 * groups and use only one of each (a resolver opening one per family), so
 * the cookies kpr sees step by 2, 4 or 8. A multiplicative hash keeps the
 * low bits, and hash % count would then name one slot for all of them; this
 * spreads any stride evenly.
 */
static __always_inline __u32 lb_hash64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return (__u32)x;
}

/* The node's secret for the flow hash (kpr_node_seed); 0 only before the
 * loader has filled it, which it does before any program runs. */
static __always_inline __u64 lb_node_seed(void)
{
	__u32 zero = 0;
	const __u64 *seed = bpf_map_lookup_elem(&kpr_node_seed, &zero);

	return seed ? *seed : 0;
}

/*
 * The backend in slot (hash % master->count) + 1 of the frontend key names,
 * with its id in *backend_id; NULL when the slot or its backend is missing
 * (the control plane is between writes). key->slot is 0 again on return.
 * master is key's master entry, with a count above 0.
 */
static __always_inline const struct backend *lb_pick_slot(struct svc_key *key,
							   const struct svc_value *master,
							   __u32 hash, __u32 *backend_id)
{
	const struct svc_value *slot;

	key->slot = (hash % master->count) + 1;
	slot = bpf_map_lookup_elem(&kpr_services, key);
	key->slot = 0;
	if (!slot)
		return NULL;
	*backend_id = slot->backend_id;
	return bpf_map_lookup_elem(&kpr_backends, backend_id);
}

/*
 * The backend id the frontend's Maglev table (kpr_maglev, of table_size
 * entries) gives hash, or 0 when the frontend has no table or the table
 * has nothing there. A table of another size (a kpr restarted with another
 * table size, until the control plane replaces its tables) still names a
 * backend of the Service, or nothing past its end.
 */
static __always_inline __u32 lb_maglev_backend(const struct svc_value *master, __u8 scope,
					       __u32 hash, __u32 table_size)
{
	struct maglev_key key = {.rev_nat_id = master->rev_nat_id, .scope = scope};
	const __u32 *id;
	void *table;
	__u32 slot;

	table = bpf_map_lookup_elem(&kpr_maglev, &key);
	if (!table)
		return 0;
	slot = hash % table_size;
	id = bpf_map_lookup_elem(table, &slot);
	return id ? *id : 0;
}

/* Whether the frontend picks backends by a Maglev table. */
static __always_inline int lb_has_maglev(const struct svc_value *master, __u8 scope)
{
	struct maglev_key key = {.rev_nat_id = master->rev_nat_id, .scope = scope};

	return bpf_map_lookup_elem(&kpr_maglev, &key) != NULL;
}

/*
 * ClientIP affinity. Each object keeps its own map of it, keyed by what
 * names its clients (kpr_affinity by network namespace cookie,
 * kpr_tc_affinity by client address), with struct affinity_value as the
 * value: map and client_key are the caller's.
 *
 * The backend this client last used for the Service (master, in scope), if
 * the affinity has not timed out and that backend still serves the Service
 * in scope; else 0.
 */
static __always_inline __u32 lb_affinity_lookup(void *map, const void *client_key,
						const struct svc_value *master, __u8 scope,
						__u64 now)
{
	struct affinity_match_key match = {.rev_nat_id = master->rev_nat_id, .scope = scope};
	const struct affinity_value *val;

	val = bpf_map_lookup_elem(map, client_key);
	if (!val || now - val->last_used_ns > (__u64)master->affinity_timeout * 1000000000ULL)
		return 0;
	match.backend_id = val->backend_id;
	if (!bpf_map_lookup_elem(&kpr_affinity_match, &match))
		return 0;
	return match.backend_id;
}

/* Remember that the client (client_key in map) used backend_id now. */
static __always_inline void lb_affinity_update(void *map, const void *client_key,
					       __u32 backend_id, __u64 now)
{
	struct affinity_value val = {.last_used_ns = now, .backend_id = backend_id};

	bpf_map_update_elem(map, client_key, &val, BPF_ANY);
}
