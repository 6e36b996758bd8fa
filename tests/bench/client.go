package bench

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Source ports are handed out in rotation from clientPortLow to
// clientPortHigh instead of by the kernel. Under kube-proxy every
// connection leaves a conntrack entry behind (10s after our RST, 120s after
// a probe that was never answered), and a new connection that reuses the
// 4-tuple of such an entry inherits its NAT decision: a probe sent before
// the rules existed would keep a later connection on the same port away
// from any backend. The kernel's choice reuses a port to the same Service
// within seconds at the rates measured here; the rotation reuses one only
// after 50,000 other connections.
const (
	clientPortLow  = 10000
	clientPortHigh = 60000
)

var clientPortSeq atomic.Uint32

// bindNextPort binds fd to the next free port of the rotation.
func bindNextPort(fd int) error {
	var err error
	for range 100 {
		port := clientPortLow + int(clientPortSeq.Add(1)%(clientPortHigh-clientPortLow))
		if err = unix.Bind(fd, &unix.SockaddrInet4{Port: port}); !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("bind a client port: %w", err)
	}
	return nil
}

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
	if err := bindNextPort(fd); err != nil {
		return 0, "", err
	}
	if err := connectBlocking(fd, addr, start.Add(timeout)); err != nil {
		return 0, "", fmt.Errorf("connect %s: %w", addr, err)
	}
	if _, err := retryEINTR(func() (int, error) { return unix.Write(fd, []byte{'x'}) }); err != nil {
		return 0, "", fmt.Errorf("send to %s: %w", addr, err)
	}
	var got []byte
	buf := make([]byte, 256)
	for {
		n, err := retryEINTR(func() (int, error) { return unix.Read(fd, buf) })
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

// Go's runtime preempts goroutines with signals (SIGURG), and a socket call
// with a timeout set is never restarted after a signal: it fails with
// EINTR (signal(7)). Reads and writes are simply retried.
func retryEINTR(call func() (int, error)) (int, error) {
	for {
		n, err := call()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// connectBlocking connects fd, and when a signal interrupts the blocking
// connect (which goes on in the background), waits for its outcome until
// deadline.
func connectBlocking(fd int, addr netip.AddrPort, deadline time.Time) error {
	err := unix.Connect(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())})
	if !errors.Is(err, unix.EINTR) {
		return err
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return err
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
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
