package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// Reading the tc programs' conntrack (kpr_conntrack) and counters
// (kpr_tc_stats), for inspection and metrics. Only the programs write them.

// The values of enum ct_dir and enum ct_flags (bpf/types.h), which bpf2go
// does not generate: conntrack_test.go checks them against the object's BTF.
const (
	ctDirForward = 0
	ctDirReply   = 1

	ctFlagReplied  = 1
	ctFlagFin      = 2
	ctFlagRst      = 4
	ctFlagSNAT     = 8
	ctFlagAckFwd   = 16
	ctFlagAckReply = 32
	ctFlagFinFwd   = 64
	ctFlagFinReply = 128
)

// ConntrackFlow is one flow the tc programs translate, from its forward
// entry.
type ConntrackFlow struct {
	Client   netip.AddrPort
	Frontend netip.AddrPort
	Proto    dataplane.Protocol
	Backend  netip.AddrPort
	// SNAT is the node address and port the flow leaves from toward a
	// backend on another node; invalid when the flow is not SNATed.
	SNAT netip.AddrPort
	// Replied, Fin and Rst say what the flow has shown.
	Replied, Fin, Rst bool
	// Established says that a TCP flow has completed its handshake in
	// both directions: a segment without SYN has come from the client and
	// from the backend. Until then it has the handshake lifetime, and its
	// SNAT port may be taken over by a new flow. Always false for UDP.
	Established bool
	// ExpiresIn is how long the flow lives without another packet;
	// negative once it is over (its entry stays until evicted).
	ExpiresIn time.Duration
	BackendID uint32
	RevNatID  uint32
}

// ConntrackFlows lists the flows in ms, the tc programs' conntrack maps
// (kpr_conntrack and kpr_ct_new: a flow is in one of them).
func ConntrackFlows(ms ...*ebpf.Map) ([]ConntrackFlow, error) {
	var out []ConntrackFlow
	for _, m := range ms {
		flows, err := conntrackFlowsIn(m)
		out = append(out, flows...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func conntrackFlowsIn(m *ebpf.Map) ([]ConntrackFlow, error) {
	now, err := monotonicNow()
	if err != nil {
		return nil, err
	}
	var out []ConntrackFlow
	var k bpf.KprCtKey
	var v bpf.KprCtValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Dir != ctDirForward {
			continue
		}
		f := ConntrackFlow{
			Client:   netip.AddrPortFrom(addrFromBPF(k.Saddr), portFromBPF(k.Sport)),
			Frontend: netip.AddrPortFrom(addrFromBPF(k.Daddr), portFromBPF(k.Dport)),
			Proto:    dataplane.Protocol(k.Proto),
			Backend:  netip.AddrPortFrom(addrFromBPF(v.Addr), portFromBPF(v.Port)),
			Replied:  v.Flags&ctFlagReplied != 0,
			Fin:      v.Flags&ctFlagFin != 0,
			Rst:      v.Flags&ctFlagRst != 0,
			Established: dataplane.Protocol(k.Proto) == dataplane.TCP &&
				v.Flags&(ctFlagAckFwd|ctFlagAckReply) == ctFlagAckFwd|ctFlagAckReply,
			ExpiresIn: time.Duration(int64(v.ExpiresNs) - int64(now)),
			BackendID: v.BackendId,
			RevNatID:  v.RevNatId,
		}
		if v.Flags&ctFlagSNAT != 0 {
			f.SNAT = netip.AddrPortFrom(addrFromBPF(v.NatAddr), portFromBPF(v.NatPort))
		}
		out = append(out, f)
	}
	// An LRU map the programs write while it is read can abort the walk:
	// what was read is still a true sample.
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return out, fmt.Errorf("read conntrack map %s: %w", m, err)
	}
	return out, nil
}

// TCStats sums the per-CPU counters in m, a kpr_tc_stats map.
func TCStats(m *ebpf.Map) (bpf.KprNatStats, error) {
	var per []bpf.KprNatStats
	var sum bpf.KprNatStats
	if err := m.Lookup(uint32(0), &per); err != nil {
		return sum, fmt.Errorf("read tc counters: %w", err)
	}
	// Every field is a uint64 counter: summing them all keeps up with the
	// fields the struct gains.
	total := reflect.ValueOf(&sum).Elem()
	for _, s := range per {
		v := reflect.ValueOf(s)
		for i := 0; i < v.NumField(); i++ {
			if f := total.Field(i); f.Kind() == reflect.Uint64 {
				f.SetUint(f.Uint() + v.Field(i).Uint())
			}
		}
	}
	return sum, nil
}

// monotonicNow is bpf_ktime_get_ns()'s clock.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read the monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// DeleteUDPFlows deletes from ms, the tc programs' conntrack maps, the UDP
// flows that the tc programs sent from one of removed's frontends to its
// backend, both entries of each, and returns how many flows it deleted. It
// is the tc counterpart of kube-proxy's conntrack cleanup: UDP has no
// connection to end, so without it a client that keeps sending from one
// port stays on a backend that has left (the programs' own liveness check
// only notices a backend that is gone from every Service). A flow whose
// entries the programs replace meanwhile is simply not found; an LRU walk
// aborted by concurrent writes is retried once, and what it missed is
// reported.
func DeleteUDPFlows(removed []dataplane.RemovedBackend, ms ...*ebpf.Map) (int, error) {
	deleted := 0
	for _, m := range ms {
		n, err := deleteUDPFlowsIn(m, removed)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// deleteUDPFlowsIn is DeleteUDPFlows for one map, which holds both entries
// of each of its flows.
func deleteUDPFlowsIn(m *ebpf.Map, removed []dataplane.RemovedBackend) (int, error) {
	if m == nil || len(removed) == 0 {
		return 0, nil
	}
	gone := make(map[dataplane.RemovedBackend]bool, len(removed))
	for _, r := range removed {
		gone[dataplane.RemovedBackend{
			Frontend: netip.AddrPortFrom(r.Frontend.Addr().Unmap(), r.Frontend.Port()),
			Backend:  netip.AddrPortFrom(r.Backend.Addr().Unmap(), r.Backend.Port()),
		}] = true
	}
	var keys []bpf.KprCtKey
	walk := func() error {
		keys = keys[:0]
		var k bpf.KprCtKey
		var v bpf.KprCtValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			if k.Dir != ctDirForward || k.Proto != uint8(dataplane.UDP) {
				continue
			}
			pair := dataplane.RemovedBackend{
				Frontend: netip.AddrPortFrom(addrFromBPF(k.Daddr), portFromBPF(k.Dport)),
				Backend:  netip.AddrPortFrom(addrFromBPF(v.Addr), portFromBPF(v.Port)),
			}
			if !gone[pair] {
				continue
			}
			keys = append(keys, k, replyKey(k, v))
		}
		return it.Err()
	}
	err := walk()
	if errors.Is(err, ebpf.ErrIterationAborted) {
		err = walk()
	}
	deleted := 0
	for i := 0; i < len(keys); i += 2 {
		// The forward entry first: once it is gone the next datagram
		// picks a live backend, and its new reply entry replaces the old.
		ferr := m.Delete(&keys[i])
		if ferr != nil && !errors.Is(ferr, ebpf.ErrKeyNotExist) {
			return deleted, fmt.Errorf("delete conntrack entry of a removed UDP backend: %w", ferr)
		}
		if rerr := m.Delete(&keys[i+1]); rerr != nil && !errors.Is(rerr, ebpf.ErrKeyNotExist) {
			return deleted, fmt.Errorf("delete conntrack entry of a removed UDP backend: %w", rerr)
		}
		if ferr == nil {
			deleted++
		}
	}
	if err != nil {
		return deleted, fmt.Errorf("read conntrack map for removed UDP backends (some flows may stay on them until they expire): %w", err)
	}
	return deleted, nil
}

// replyKey is the key of the reply entry of the flow whose forward entry is
// k, v: the backend answering the client, or the node address and port the
// flow was SNATed to (ct_reply_key in bpf/ct.h).
func replyKey(k bpf.KprCtKey, v bpf.KprCtValue) bpf.KprCtKey {
	r := bpf.KprCtKey{Saddr: v.Addr, Sport: v.Port, Daddr: k.Saddr, Dport: k.Sport, Proto: k.Proto, Dir: ctDirReply}
	if v.Flags&ctFlagSNAT != 0 {
		r.Daddr, r.Dport = v.NatAddr, v.NatPort
	}
	return r
}

// DeleteUDPFlows deletes the tc programs' flows to removed UDP backends
// (DeleteUDPFlows); an LB without the conntrack map (in memory, read-only)
// deletes nothing.
func (lb *LB) DeleteUDPFlows(removed []dataplane.RemovedBackend) (int, error) {
	if lb.readOnly {
		return 0, errReadOnly
	}
	return DeleteUDPFlows(removed, lb.conntrack...)
}
