package syncperf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
)

// MapReader looks single Services up in kpr's pinned maps. maps.OpenReadOnly
// reads every entry (over 100,000 with 10,000 Services), far too slow to
// poll for one Service's change; MapReader does a point lookup per entry
// instead. Its key encoding follows bpf/types.h as package maps writes it; the
// correctness test checks it against maps.OpenReadOnly on every Service.
type MapReader struct {
	maps *bpf.KprMaps
}

// OpenMapReader opens the maps kpr pinned under bpfRoot.
func OpenMapReader(bpfRoot string) (*MapReader, error) {
	m, err := loader.OpenPinnedMaps(bpfRoot)
	if err != nil {
		return nil, err
	}
	return &MapReader{maps: m}, nil
}

// Close releases the map handles; the pins stay.
func (r *MapReader) Close() error { return r.maps.Close() }

// errIncomplete: the lookup met a missing entry, as happens while kpr
// rewrites the Service between two of our lookups.
var errIncomplete = errors.New("service entry incomplete")

// svcKey returns the service-map key of an internal-scope TCP frontend.
func svcKey(vip netip.Addr, port uint16, slot uint16) bpf.KprSvcKey {
	k := bpf.KprSvcKey{Port: netOrder16(port), Proto: uint8(dataplane.TCP),
		Scope: uint8(bpf.KprSvcScopeSVC_SCOPE_INTERNAL), Slot: slot}
	b := vip.As16() // IPv4 as ::ffff:a.b.c.d, as the maps keep it
	for i := range k.Addr {
		k.Addr[i] = binary.NativeEndian.Uint32(b[i*4:])
	}
	return k
}

// netOrder16 converts a port between host order and the maps' network
// order; the conversion is its own inverse, so it serves both directions.
func netOrder16(p uint16) uint16 {
	return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, p))
}

// BackendCount returns the backend count of the frontend vip:port/TCP (its
// master entry), and false if the frontend is not in the map. kpr writes a
// master last, after its slots and backends, so a master with the full
// count means the Service is programmed.
func (r *MapReader) BackendCount(vip netip.Addr, port uint16) (int, bool, error) {
	var v bpf.KprSvcValue
	err := r.maps.KprServices.Lookup(svcKey(vip, port, 0), &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("look up frontend %s:%d: %w", vip, port, err)
	}
	return int(v.Count), true, nil
}

// Backends returns the backends of the frontend vip:port/TCP, sorted; nil
// if the frontend is not in the map or is being rewritten.
func (r *MapReader) Backends(vip netip.Addr, port uint16) ([]netip.AddrPort, error) {
	n, ok, err := r.BackendCount(vip, port)
	if err != nil || !ok {
		return nil, err
	}
	out := make([]netip.AddrPort, 0, n)
	for slot := 1; slot <= n; slot++ {
		b, err := r.backendInSlot(vip, port, uint16(slot))
		if errors.Is(err, errIncomplete) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out, nil
}

func (r *MapReader) backendInSlot(vip netip.Addr, port, slot uint16) (netip.AddrPort, error) {
	var sv bpf.KprSvcValue
	if err := r.maps.KprServices.Lookup(svcKey(vip, port, slot), &sv); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return netip.AddrPort{}, errIncomplete
		}
		return netip.AddrPort{}, fmt.Errorf("look up slot %d of %s:%d: %w", slot, vip, port, err)
	}
	var be bpf.KprBackend
	if err := r.maps.KprBackends.Lookup(sv.BackendId, &be); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return netip.AddrPort{}, errIncomplete
		}
		return netip.AddrPort{}, fmt.Errorf("look up backend %d: %w", sv.BackendId, err)
	}
	var b [16]byte
	for i, w := range be.Addr {
		binary.NativeEndian.PutUint32(b[i*4:], w)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(b).Unmap(), netOrder16(be.Port)), nil
}
