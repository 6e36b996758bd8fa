package loader

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/bpf"
)

// SocketLBMode says which sockets the socket hooks serve (kpr run
// --socket-lb). The sockets they do not serve keep the Service address in
// connect() and sendmsg(), and their packets meet the Service at packet
// level. The mode is a constant of the hooks: changing it reloads them.
type SocketLBMode int

const (
	// SocketLBAll serves every socket under the cgroup root.
	SocketLBAll SocketLBMode = iota
	// SocketLBHostOnly serves only the sockets of the node's own network
	// namespace: every pod is left to the packet path (Cilium's
	// socketLB.hostNamespaceOnly).
	SocketLBHostOnly
	// SocketLBPerPod serves every socket except those of the pods whose
	// network namespaces the control plane lists in kpr_sock_bypass.
	SocketLBPerPod
)

// SocketLBModes are the flag's values, in the order of the constants.
var SocketLBModes = []string{"all", "host-only", "per-pod"}

func (m SocketLBMode) String() string {
	if int(m) < len(SocketLBModes) {
		return SocketLBModes[m]
	}
	return fmt.Sprintf("SocketLBMode(%d)", int(m))
}

// ParseSocketLBMode reads a --socket-lb value.
func ParseSocketLBMode(s string) (SocketLBMode, error) {
	for i, name := range SocketLBModes {
		if s == name {
			return SocketLBMode(i), nil
		}
	}
	return 0, fmt.Errorf("--socket-lb %q: want one of %v", s, SocketLBModes)
}

func (m SocketLBMode) hookConstant() bpf.KprSockLbMode {
	switch m {
	case SocketLBHostOnly:
		return bpf.KprSockLbModeSOCK_LB_HOST_ONLY
	case SocketLBPerPod:
		return bpf.KprSockLbModeSOCK_LB_PER_POD
	default:
		return bpf.KprSockLbModeSOCK_LB_ALL
	}
}

// effectiveSocketLB is the mode the hooks can run: both modes other than
// all tell sockets apart by their network namespace's cookie, which the
// control plane reads with SO_NETNS_COOKIE (Linux 5.14+); hostCookie is 0
// without it. host-only cannot work then, and is refused; per-pod, the
// default, falls back to serving every socket, with a warning, so that an
// older kernel still runs kpr.
func effectiveSocketLB(want SocketLBMode, hostCookie uint64, log *zap.Logger) (SocketLBMode, error) {
	if want == SocketLBAll || hostCookie != 0 {
		return want, nil
	}
	if want == SocketLBHostOnly {
		return 0, fmt.Errorf("--socket-lb host-only tells the node's sockets from the pods' by their network namespace, " +
			"which needs SO_NETNS_COOKIE (Linux 5.14+) and the host namespace's cookie; use --socket-lb all on this node")
	}
	log.Warn("the socket hooks serve every pod: choosing pods needs SO_NETNS_COOKIE (Linux 5.14+) to tell their network namespaces apart",
		zap.Stringer("socketLB", want))
	return SocketLBAll, nil
}
