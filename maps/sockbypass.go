package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
)

// SockBypass is kpr_sock_bypass: the network namespaces, one per pod, whose
// sockets the socket hooks leave to the packet path under --socket-lb
// per-pod. The key is the namespace's cookie, which the kernel never
// reuses, so an entry outliving its pod is harmless until it is removed.
type SockBypass struct {
	m *ebpf.Map
}

// NewSockBypass wraps m, a kpr_sock_bypass map.
func NewSockBypass(m *ebpf.Map) *SockBypass { return &SockBypass{m: m} }

// SockBypassReason is why a pod is bypassed, as the map stores it.
type SockBypassReason = bpf.KprSockBypassReason

// The reasons of enum sock_bypass_reason (bpf/types.h).
const (
	SockBypassAnnotation = bpf.KprSockBypassReasonSOCK_BYPASS_ANNOTATION
	SockBypassMesh       = bpf.KprSockBypassReasonSOCK_BYPASS_MESH
	SockBypassSandbox    = bpf.KprSockBypassReasonSOCK_BYPASS_SANDBOX
)

// Set bypasses the sockets of the network namespace netns.
func (s *SockBypass) Set(netns uint64, reason SockBypassReason) error {
	if err := s.m.Update(netns, bpf.KprSockBypass{Reason: reason}, ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("bypass network namespace %d: %w: kpr_sock_bypass holds %d pods, and the pod stays with the socket hooks",
				netns, ErrMapFull, s.m.MaxEntries())
		}
		return fmt.Errorf("bypass network namespace %d: %w", netns, err)
	}
	return nil
}

// Delete serves netns's sockets again; a missing entry is no error.
func (s *SockBypass) Delete(netns uint64) error {
	if err := s.m.Delete(netns); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("stop bypassing network namespace %d: %w", netns, err)
	}
	return nil
}

// List returns every bypassed namespace and its reason.
func (s *SockBypass) List() (map[uint64]SockBypassReason, error) {
	out := map[uint64]SockBypassReason{}
	var key uint64
	var val bpf.KprSockBypass
	it := s.m.Iterate()
	for it.Next(&key, &val) {
		out[key] = val.Reason
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read kpr_sock_bypass: %w", err)
	}
	return out, nil
}
