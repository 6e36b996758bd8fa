/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Address helpers every program object needs to build map keys in the
 * 16-byte form types.h describes (IPv4 as ::ffff:a.b.c.d).
 */
#pragma once

#include <linux/types.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10

static __always_inline void addr_from_v4(__u32 addr[4], __u32 ip4)
{
	addr[0] = 0;
	addr[1] = 0;
	addr[2] = bpf_htonl(0xffff);
	addr[3] = ip4;
}

static __always_inline void addr_copy(__u32 dst[4], const __u32 src[4])
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

/* Whether a 16-byte address is of the v4-mapped form: an IPv4 address as
 * the maps hold it. An IPv6 packet that carries one must never be taken
 * for IPv4, or it would reach IPv4 frontends, conntrack entries and
 * source ranges. */
static __always_inline int addr_v4_mapped(const __u32 addr[4])
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

/* Whether a 16-byte address is a loopback one: 127.0.0.0/8 in the
 * v4-mapped form, or ::1. */
static __always_inline int addr_loopback(const __u32 addr[4])
{
	if (addr_v4_mapped(addr))
		return (bpf_ntohl(addr[3]) >> 24) == 127;
	return addr[0] == 0 && addr[1] == 0 && addr[2] == 0 && addr[3] == bpf_htonl(1);
}

static __always_inline int addr_eq(const __u32 a[4], const __u32 b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}
