package e2e

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// pauseProxy relays TCP connections to a target, and can stop relaying
// without closing anything: while paused it accepts connections and reads
// what each side sends, but passes nothing on, as a stuck load balancer or
// a half-open connection would. The peers see an open, silent connection.
type pauseProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

// newPauseProxy relays 127.0.0.1:<port> to target until the test ends.
func newPauseProxy(t *testing.T, target string) *pauseProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pauseProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients connect to.
func (p *pauseProxy) Addr() string { return p.ln.Addr().String() }

// Pause stops relaying; Resume relays again, what was held first.
func (p *pauseProxy) Pause()  { p.set(true) }
func (p *pauseProxy) Resume() { p.set(false) }

func (p *pauseProxy) set(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *pauseProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.relay(server, client)
		go p.relay(client, server)
	}
}

func (p *pauseProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// relay copies from src to dst, holding each chunk while paused.
func (p *pauseProxy) relay(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused && !p.closed {
				p.cond.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			// One side closed: close the other, as a relay does.
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			dst.Close()
			return
		}
	}
}

func (p *pauseProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	p.cond.Broadcast()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
