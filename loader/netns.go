package loader

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/netnsexec"
)

// OwnNetNS is the network namespace of the kpr process itself. The DaemonSet
// runs kpr with hostNetwork, so this is the node's own namespace.
const OwnNetNS = "/proc/self/ns/net"

// NetNSCookie returns the kernel's cookie for the network namespace at path
// (a /proc/PID/ns/net file or a bind mount of one): the value
// bpf_get_netns_cookie returns for sockets of that namespace. It reads it
// with SO_NETNS_COOKIE (Linux 5.14+) from a socket created there.
func NetNSCookie(path string) (uint64, error) {
	var fd int
	err := netnsexec.InPath(path, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("create a socket in network namespace %s: %w", path, err)
	}
	// The socket keeps its namespace wherever it is read from.
	defer unix.Close(fd)
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if errors.Is(err, unix.ENOPROTOOPT) {
		return 0, fmt.Errorf("read the cookie of network namespace %s: kernel lacks SO_NETNS_COOKIE (Linux 5.14+): %w", path, err)
	}
	if err != nil {
		return 0, fmt.Errorf("read the cookie of network namespace %s: %w", path, err)
	}
	return cookie, nil
}
