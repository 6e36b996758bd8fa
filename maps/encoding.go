package maps

import (
	"encoding/binary"
	"math"
	"net/netip"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
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

// svcKinds pairs every dataplane.FrontendKind with the enum svc_kind value
// (bpf/types.h) that svc_value.kind persists for it. The pinned maps
// outlive kpr, and a later kpr reads back what this one wrote: the number
// on disk is the C enum's, never the position of a Go constant, so the Go
// constants may be reordered or added to freely. A new kind needs a new
// enum svc_kind value and a row here.
var svcKinds = [...]struct {
	kind dataplane.FrontendKind
	bpf  bpf.KprSvcKind
}{
	{dataplane.ClusterIP, bpf.KprSvcKindSVC_KIND_CLUSTER_IP},
	{dataplane.NodePort, bpf.KprSvcKindSVC_KIND_NODE_PORT},
	{dataplane.ExternalIP, bpf.KprSvcKindSVC_KIND_EXTERNAL_IP},
	{dataplane.LoadBalancer, bpf.KprSvcKindSVC_KIND_LOAD_BALANCER},
}

// unknownKind is what Get reports for a persisted kind this kpr has no
// name for: one a newer kpr wrote, or a damaged entry. It is no kind a
// Service can have (validate refuses it), so such an entry never Matches
// and the next sync rewrites it with the kind it should have.
const unknownKind = dataplane.FrontendKind(math.MaxUint8)

// kindToBPF returns the svc_value.kind that stands for k; false for a kind
// with no enum svc_kind value.
func kindToBPF(k dataplane.FrontendKind) (uint8, bool) {
	for _, e := range svcKinds {
		if e.kind == k {
			return uint8(e.bpf), true
		}
	}
	return 0, false
}

// kindFromBPF returns the kind a persisted svc_value.kind stands for, or
// unknownKind and false for a value enum svc_kind does not have.
func kindFromBPF(v uint8) (dataplane.FrontendKind, bool) {
	for _, e := range svcKinds {
		if uint32(e.bpf) == uint32(v) {
			return e.kind, true
		}
	}
	return unknownKind, false
}
