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

	ctFlagReplied = 1
	ctFlagFin     = 2
	ctFlagRst     = 4
	ctFlagSNAT    = 8
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
	// ExpiresIn is how long the flow lives without another packet;
	// negative once it is over (its entry stays until evicted).
	ExpiresIn time.Duration
	BackendID uint32
	RevNatID  uint32
}

// ConntrackFlows lists the flows in m, a kpr_conntrack map.
func ConntrackFlows(m *ebpf.Map) ([]ConntrackFlow, error) {
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
			Client:    netip.AddrPortFrom(addrFromBPF(k.Saddr), portFromBPF(k.Sport)),
			Frontend:  netip.AddrPortFrom(addrFromBPF(k.Daddr), portFromBPF(k.Dport)),
			Proto:     dataplane.Protocol(k.Proto),
			Backend:   netip.AddrPortFrom(addrFromBPF(v.Addr), portFromBPF(v.Port)),
			Replied:   v.Flags&ctFlagReplied != 0,
			Fin:       v.Flags&ctFlagFin != 0,
			Rst:       v.Flags&ctFlagRst != 0,
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
		return out, fmt.Errorf("read conntrack map: %w", err)
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
