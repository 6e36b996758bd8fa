package loader

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// OwnNetNS is the network namespace of the kpr process itself. The DaemonSet
// runs kpr with hostNetwork, so this is the node's own namespace.
const OwnNetNS = "/proc/self/ns/net"

// NetNSCookie returns the kernel's cookie for the network namespace at path
// (a /proc/PID/ns/net file or a bind mount of one): the value
// bpf_get_netns_cookie returns for sockets of that namespace. It reads it
// with SO_NETNS_COOKIE (Linux 5.14+) from a socket created there, on a
// thread of its own, so no caller's thread ever changes namespace.
func NetNSCookie(path string) (uint64, error) {
	type result struct {
		cookie uint64
		err    error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		cookie, restored, err := netnsCookieOnThisThread(path)
		if restored {
			runtime.UnlockOSThread()
		}
		// A thread that could not return to its namespace stays locked, so
		// the runtime ends it with this goroutine instead of reusing it.
		done <- result{cookie, err}
	}()
	r := <-done
	return r.cookie, r.err
}

func netnsCookieOnThisThread(path string) (cookie uint64, restored bool, err error) {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, true, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer unix.Close(target)
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, true, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return 0, true, fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	fd, sockErr := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	restored = unix.Setns(orig, unix.CLONE_NEWNET) == nil
	if sockErr != nil {
		return 0, restored, fmt.Errorf("create a socket in network namespace %s: %w", path, sockErr)
	}
	defer unix.Close(fd)
	cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if errors.Is(err, unix.ENOPROTOOPT) {
		return 0, restored, fmt.Errorf("read the cookie of network namespace %s: kernel lacks SO_NETNS_COOKIE (Linux 5.14+): %w", path, err)
	}
	if err != nil {
		return 0, restored, fmt.Errorf("read the cookie of network namespace %s: %w", path, err)
	}
	return cookie, restored, nil
}
