package migration

import (
	"bufio"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
)

// flow is one long-lived client flow that keeps exchanging requests with
// a backend until stopped, counting the requests that fail.
type flow struct {
	name string
	// ask makes one request and checks its answer.
	ask   func(seq int) error
	close func() error

	mu       sync.Mutex
	ok, fail int
	errs     []string
	stop     chan struct{}
	done     chan struct{}
}

// requestInterval paces every flow: a gap in service longer than this
// fails a request.
const requestInterval = 10 * time.Millisecond

func (fl *flow) run() {
	fl.stop, fl.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(fl.done)
		for seq := 0; ; seq++ {
			select {
			case <-fl.stop:
				return
			case <-time.After(requestInterval):
			}
			err := fl.ask(seq)
			fl.mu.Lock()
			if err != nil {
				fl.fail++
				if len(fl.errs) < 5 {
					fl.errs = append(fl.errs, fmt.Sprintf("request %d at %s: %v", seq, time.Now().Format("15:04:05.000"), err))
				}
			} else {
				fl.ok++
			}
			fl.mu.Unlock()
		}
	}()
}

// counts returns the requests made so far that passed and failed.
func (fl *flow) counts() (ok, fail int, errs []string) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.ok, fl.fail, append([]string(nil), fl.errs...)
}

func (fl *flow) finish() error {
	close(fl.stop)
	<-fl.done
	return fl.close()
}

// tcpFlow is a TCP connection to addr that echoes a numbered line per
// request.
func tcpFlow(ns *harness.NetNS, name string, addr netip.AddrPort) (*flow, error) {
	c, err := harness.DialTCP(ns, addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err != nil { // the pod's greeting
		c.Close()
		return nil, fmt.Errorf("%s: read the greeting: %w", name, err)
	}
	return &flow{name: name, close: c.Close, ask: func(seq int) error {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		want := fmt.Sprintf("req-%d\n", seq)
		if _, err := c.Write([]byte(want)); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("echo %q, want %q", got, want)
		}
		return nil
	}}, nil
}

// udpConnectedFlow is a connected UDP socket to addr, as a resolver
// keeps: its destination is fixed when it connects.
func udpConnectedFlow(ns *harness.NetNS, name string, addr netip.AddrPort) (*flow, error) {
	c, err := harness.DialUDP(ns, addr)
	if err != nil {
		return nil, err
	}
	return &flow{name: name, close: c.Close, ask: func(int) error {
		_, err := harness.AskUDP(c, time.Second)
		return err
	}}, nil
}

// udpUnconnectedFlow sends every request from one unconnected socket to
// addr, and checks that the reply comes from addr: each datagram goes
// through whichever proxy translates at that moment.
func udpUnconnectedFlow(ns *harness.NetNS, name string, addr netip.AddrPort) (*flow, error) {
	c, err := harness.ListenUDP(ns, addr.Addr())
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 64<<10)
	return &flow{name: name, close: c.Close, ask: func(seq int) error {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		payload := fmt.Sprintf("req-%d", seq)
		if _, err := c.WriteToUDPAddrPort([]byte(payload), addr); err != nil {
			return err
		}
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return err
			}
			// A late reply to an earlier, timed-out request is not this
			// one's.
			if !strings.HasSuffix(string(buf[:n]), "\n"+payload) {
				continue
			}
			if from != addr {
				return fmt.Errorf("reply from %s, want %s", from, addr)
			}
			return nil
		}
	}}, nil
}

// flowSet is the flows of one phase of a migration.
type flowSet []*flow

// openFlows opens a TCP, a connected UDP and an unconnected UDP flow to
// the ClusterIP, and a TCP and a connected UDP flow to the NodePort, and
// starts them. label names the phase they were opened in.
func (f *fixture) openFlows(label string) flowSet {
	f.t.Helper()
	ns := f.env.Node.NetNS
	var fs flowSet
	for _, o := range []struct {
		name string
		open func(*harness.NetNS, string, netip.AddrPort) (*flow, error)
		addr netip.AddrPort
	}{
		{"tcp clusterIP", tcpFlow, f.clusterTCP},
		{"udp connected clusterIP", udpConnectedFlow, f.clusterUDP},
		{"udp unconnected clusterIP", udpUnconnectedFlow, f.clusterUDP},
		{"tcp nodePort", tcpFlow, f.nodeTCP},
		{"udp connected nodePort", udpConnectedFlow, f.nodeUDP},
	} {
		name := fmt.Sprintf("%s (%s, opened through %s)", o.name, o.addr, label)
		fl, err := o.open(ns, name, o.addr)
		if err != nil {
			f.t.Fatalf("open %s: %v", name, err)
		}
		fl.run()
		fs = append(fs, fl)
		f.t.Cleanup(func() { _ = fl.close() })
	}
	// Every flow has passed a request before the switch starts.
	deadline := time.Now().Add(5 * time.Second)
	for _, fl := range fs {
		for {
			ok, fail, errs := fl.counts()
			if fail > 0 {
				f.t.Fatalf("%s failed before any switch: %v", fl.name, errs)
			}
			if ok > 0 {
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("%s made no request in 5s", fl.name)
			}
			time.Sleep(requestInterval)
		}
	}
	return fs
}

// checkNoFailures fails the test for every flow that failed a request,
// and checks each kept exchanging requests.
func (f *fixture) checkNoFailures(t *testing.T, fs flowSet, since map[*flow]int) {
	t.Helper()
	for _, fl := range fs {
		ok, fail, errs := fl.counts()
		if fail > 0 {
			t.Errorf("%s: %d of %d requests failed: %s", fl.name, fail, ok+fail, strings.Join(errs, "; "))
		}
		if ok <= since[fl] {
			t.Errorf("%s: no request passed during the switch", fl.name)
		}
	}
}

// mark records how many requests each flow has passed so far.
func mark(fs ...flowSet) map[*flow]int {
	m := map[*flow]int{}
	for _, s := range fs {
		for _, fl := range s {
			m[fl], _, _ = fl.counts()
		}
	}
	return m
}
