package maps

import (
	"encoding/binary"
	"net/netip"
)

// The BPF side keeps addresses and ports in network byte order inside
// integer fields; these helpers convert between that and netip values.

// addrToBPF returns a in the maps' 16-byte form: IPv4 as ::ffff:a.b.c.d.
func addrToBPF(a netip.Addr) [4]uint32 {
	b := a.As16()
	var out [4]uint32
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[i*4:])
	}
	return out
}

func addrFromBPF(in [4]uint32) netip.Addr {
	var b [16]byte
	for i, w := range in {
		binary.NativeEndian.PutUint32(b[i*4:], w)
	}
	return netip.AddrFrom16(b).Unmap()
}

func portToBPF(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func portFromBPF(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}
