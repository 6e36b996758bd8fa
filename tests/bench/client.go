package bench

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// connectEcho is the client of every measurement: socket, connect to addr,
// send one byte, read the server's greeting ("<pod>\n") and the byte echoed
// back, close. It returns the time from socket() to the echoed byte and the
// name of the pod that answered. It uses blocking syscalls on the calling
// thread, which must be inside the node namespace (run it under
// harness.Do), so Go's poller adds no noise. The connection ends with a RST
// (SO_LINGER 0): thousands of probes leave no TIME_WAIT sockets behind to
// exhaust the ephemeral ports.
func connectEcho(addr netip.AddrPort, timeout time.Duration) (time.Duration, string, error) {
	start := time.Now()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, "", fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	defer unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	// SO_SNDTIMEO also bounds a blocking connect().
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return 0, "", fmt.Errorf("set socket timeout: %w", err)
		}
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err != nil {
		return 0, "", fmt.Errorf("connect %s: %w", addr, err)
	}
	if _, err := unix.Write(fd, []byte{'x'}); err != nil {
		return 0, "", fmt.Errorf("send to %s: %w", addr, err)
	}
	var got []byte
	buf := make([]byte, 256)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			return 0, "", fmt.Errorf("read from %s: %w", addr, err)
		}
		if n == 0 {
			return 0, "", fmt.Errorf("%s closed the connection after %q", addr, got)
		}
		got = append(got, buf[:n]...)
		if name, rest, ok := bytes.Cut(got, []byte("\n")); ok && len(rest) > 0 {
			elapsed := time.Since(start)
			if !bytes.Equal(rest, []byte{'x'}) {
				return 0, "", fmt.Errorf("%s echoed %q, want \"x\"", addr, rest)
			}
			return elapsed, string(name), nil
		}
		if len(got) > 128 {
			return 0, "", fmt.Errorf("%s sent %q: not an echo server's greeting", addr, got)
		}
	}
}

// isUnserved reports whether err means "nothing serves this address yet":
// the connection was refused, found no route, or timed out.
func isUnserved(err error) bool {
	for _, e := range []error{unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EAGAIN, unix.ETIMEDOUT, unix.EINPROGRESS, unix.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
