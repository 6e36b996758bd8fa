package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Protocol names the kind of a test server.
type Protocol string

const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	HTTP Protocol = "http"
)

// Server is a test server running in the test process with its sockets
// inside a pod namespace, listening on the same port for IPv4 and IPv6 (two
// sockets, so each family answers from its own wildcard socket).
type Server struct {
	Proto Protocol
	Port  uint16
	// Owner is the pod name the server announces.
	Owner string

	hits atomic.Int64

	mu      sync.Mutex
	stopped bool
	closers []io.Closer           // listeners, packet sockets or the http.Server
	conns   map[net.Conn]struct{} // open TCP echo connections
	wg      sync.WaitGroup
}

// Hits reports what the server has served since start or the last
// ResetHits: accepted connections (TCP), datagrams (UDP) or requests (HTTP).
func (s *Server) Hits() int64 { return s.hits.Load() }

// ResetHits zeroes the counter and returns its previous value.
func (s *Server) ResetHits() int64 { return s.hits.Swap(0) }

// Stop closes the server's sockets and open connections and waits for its
// goroutines to exit. Idempotent.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	var errs []error
	for _, c := range s.closers {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("stop %s server of %s on port %d: %w", s.Proto, s.Owner, s.Port, errors.Join(errs...))
	}
	return nil
}

func (s *Server) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

func (s *Server) goRun(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// startServer opens the sockets inside ns and starts serving.
func startServer(ns *NetNS, owner string, proto Protocol, port uint16) (*Server, error) {
	if port == 0 {
		return nil, fmt.Errorf("%s server needs a fixed port, not 0", proto)
	}
	s := &Server{Proto: proto, Port: port, Owner: owner, conns: map[net.Conn]struct{}{}}
	switch proto {
	case TCP, HTTP:
		ls, err := listenBothFamilies(ns, port)
		if err != nil {
			return nil, err
		}
		if proto == TCP {
			s.serveTCPEcho(ls)
		} else {
			s.serveHTTP(ls)
		}
	case UDP:
		pcs, err := listenPacketBothFamilies(ns, port)
		if err != nil {
			return nil, err
		}
		s.serveUDPEcho(pcs)
	default:
		return nil, fmt.Errorf("unknown protocol %q", proto)
	}
	return s, nil
}

// listenBothFamilies opens TCP listeners on 0.0.0.0:port and [::]:port
// (IPv6-only) inside ns.
func listenBothFamilies(ns *NetNS, port uint16) ([]net.Listener, error) {
	var ls []net.Listener
	err := Do(ns, func() error {
		for _, a := range []struct{ network, addr string }{
			{"tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(int(port)))},
			{"tcp6", net.JoinHostPort("::", strconv.Itoa(int(port)))},
		} {
			l, err := net.Listen(a.network, a.addr)
			if err != nil {
				return fmt.Errorf("listen %s %s in %s: %w", a.network, a.addr, ns.Name, err)
			}
			ls = append(ls, l)
		}
		return nil
	})
	if err != nil {
		for _, l := range ls {
			_ = l.Close()
		}
		return nil, err
	}
	return ls, nil
}

// listenPacketBothFamilies opens UDP sockets on 0.0.0.0:port and [::]:port
// (IPv6-only) inside ns.
func listenPacketBothFamilies(ns *NetNS, port uint16) ([]*net.UDPConn, error) {
	var pcs []*net.UDPConn
	err := Do(ns, func() error {
		for _, network := range []string{"udp4", "udp6"} {
			pc, err := net.ListenUDP(network, &net.UDPAddr{Port: int(port)})
			if err != nil {
				return fmt.Errorf("listen %s port %d in %s: %w", network, port, ns.Name, err)
			}
			pcs = append(pcs, pc)
		}
		return nil
	})
	if err != nil {
		for _, pc := range pcs {
			_ = pc.Close()
		}
		return nil, err
	}
	return pcs, nil
}

func (s *Server) serveTCPEcho(ls []net.Listener) {
	for _, l := range ls {
		s.closers = append(s.closers, l)
	}
	for _, l := range ls {
		s.goRun(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					if s.isStopped() || errors.Is(err, net.ErrClosed) {
						return
					}
					// Transient (e.g. EMFILE): back off briefly and go on.
					time.Sleep(10 * time.Millisecond)
					continue
				}
				s.hits.Add(1)
				if !s.track(c) {
					_ = c.Close()
					return
				}
				s.goRun(func() {
					defer s.untrack(c)
					if _, err := io.WriteString(c, s.Owner+"\n"); err != nil {
						return
					}
					echo(c)
				})
			}
		})
	}
}

// track records an open connection so Stop can close it; it refuses once
// the server is stopping.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	_ = c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// echo writes back what it reads until the peer closes. A plain loop rather
// than io.Copy(c, c), which would try to splice a socket into itself.
func echo(c net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) serveUDPEcho(pcs []*net.UDPConn) {
	for _, pc := range pcs {
		s.closers = append(s.closers, pc)
	}
	greeting := []byte(s.Owner + "\n")
	for _, pc := range pcs {
		s.goRun(func() {
			buf := make([]byte, 64<<10)
			for {
				n, from, err := pc.ReadFromUDPAddrPort(buf)
				if err != nil {
					if s.isStopped() || errors.Is(err, net.ErrClosed) {
						return
					}
					// A queued ICMP error (e.g. an earlier reply was
					// unreachable) surfaces here; it does not end the server.
					continue
				}
				s.hits.Add(1)
				reply := append(append(make([]byte, 0, len(greeting)+n), greeting...), buf[:n]...)
				_, _ = pc.WriteToUDPAddrPort(reply, from)
			}
		})
	}
}

func (s *Server) serveHTTP(ls []net.Listener) {
	mux := http.NewServeMux()
	// /source answers the address the connection came from, to tell
	// whether it was masqueraded on the way.
	mux.HandleFunc("/source", func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, host+"\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "hello from "+s.Owner+"\n")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
	}
	// http.Server.Close closes the listeners and every open connection.
	s.closers = append(s.closers, srv)
	for _, l := range ls {
		s.goRun(func() { _ = srv.Serve(l) })
	}
}
