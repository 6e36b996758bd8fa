package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/tests/namedns"
)

// netnsPath is where namedns.Create (and `ip netns add NAME`) pins named
// network namespaces.
func netnsPath(name string) string { return namedns.Path(name) }

// bringUpLoopback sets lo up inside the named namespace. etcd and the API
// server's health endpoints listen on 127.0.0.1 there (see netnsForwarder),
// and a freshly created namespace has lo down.
func bringUpLoopback(nsName string) error {
	ns, err := netns.GetFromPath(netnsPath(nsName))
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w (create it first, e.g. with `ip netns add %s`)", netnsPath(nsName), err, nsName)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink handle in namespace %s: %w", nsName, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo in namespace %s: %w", nsName, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting lo up in namespace %s: %w", nsName, err)
	}
	return nil
}

// netnsForwarder makes a TCP port inside a network namespace reachable from
// the host namespace: it listens on 127.0.0.1:P on the host and relays each
// connection to 127.0.0.1:P inside the namespace.
//
// Start health-checks etcd and the API server from this (host) process, and
// tests use client-go from here too, but the servers run inside the namespace
// where no host address reaches them; connecting to the host loopback is the
// only route that touches no host interface. The same port number on both
// sides lets one kubeconfig (https://127.0.0.1:P) serve clients in either
// namespace.
type netnsForwarder struct {
	ns       netns.NsHandle
	listener net.Listener
	port     string
	log      *zap.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// newNetNSForwarder listens on a free host loopback port and starts relaying.
// Holding the listener from here on keeps the port reserved on the host.
func newNetNSForwarder(nsName string, log *zap.Logger) (*netnsForwarder, error) {
	ns, err := netns.GetFromPath(netnsPath(nsName))
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", netnsPath(nsName), err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("listening on host loopback for the netns forwarder: %w", err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	f := &netnsForwarder{ns: ns, listener: l, port: port, log: log.With(zap.String("netns", nsName), zap.String("port", port)), conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.acceptLoop()
	return f, nil
}

func (f *netnsForwarder) acceptLoop() {
	defer f.wg.Done()
	for {
		client, err := f.listener.Accept()
		if err != nil {
			return // listener closed by Close
		}
		f.wg.Add(1)
		go f.relay(client)
	}
}

func (f *netnsForwarder) relay(client net.Conn) {
	defer f.wg.Done()
	server, err := DialInNetNS(f.ns, net.JoinHostPort("127.0.0.1", f.port))
	if err != nil {
		// Normal while the server is starting or stopped: the client sees a
		// closed connection, as it would without the forwarder.
		f.log.Debug("netns forwarder: dial failed", zap.Error(err))
		client.Close()
		return
	}
	if !f.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	defer f.untrack(client, server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close would be more faithful, but HTTP/2 and etcd's gRPC
		// treat either direction ending as the end of the connection.
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	client.Close()
	server.Close()
	<-done
}

func (f *netnsForwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *netnsForwarder) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
	}
}

// Close stops listening, cuts every relayed connection and waits for the
// relay goroutines to finish.
func (f *netnsForwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	err := f.listener.Close()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.ns.Close()
	return err
}

// DialInNetNS opens a TCP connection from inside ns. A socket belongs to the
// namespace of the thread that creates it, so the dial runs on a locked OS
// thread switched into ns and back; the connection keeps working from any
// thread afterwards.
func DialInNetNS(ns netns.NsHandle, address string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("getting the current network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("entering network namespace: %w", err)
	}
	conn, dialErr := net.Dial("tcp", address)
	if err := netns.Set(orig); err != nil {
		// The thread is stuck in the wrong namespace: leave it locked so
		// the runtime discards it when this goroutine ends.
		if conn != nil {
			conn.Close()
		}
		return nil, errors.Join(dialErr, fmt.Errorf("returning to the original network namespace: %w", err))
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}
