package tcnat

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// TestKprRunRestartsUnderNodePortTraffic restarts `kpr run` over and over,
// killed as a crash would and stopped as a rolling update does, while a
// client outside the node opens a connection to a NodePort every few
// milliseconds and holds others open. The NodePort has a backend on the
// node and one on another node (source-NATed). The tc programs and their
// conntrack must carry every flow across each restart: no connection
// fails, none loses a packet and sends it again, and the held ones still
// echo.
//
// The real cluster's operations test saw NodePort answers of 1 to 5 s
// around proxy starts on its emulated nodes; this is the same question
// asked of the real kernel on a fast machine, where load cannot be the
// answer.
func TestKprRunRestartsUnderNodePortTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName, otherNode = "kpr-tcnat-node", "kpr-tcnat-node2"
	cl, api := testCluster(ctx, t, nodeName)
	l := buildLAN(t, 1)
	local, err := l.node1.AddPod("local-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.ServeTCP(echoPort); err != nil {
		t.Fatal(err)
	}
	kpr := runKpr(ctx, t, cl, nodeName, l.node1.NetNS.Path, "--devices", extDev)

	const ns = "restart"
	if _, err := api.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := kubeobj.Service(ns, "np", kubeobj.Port{Name: "tcp", Port: 80, TargetPort: echoPort})
	svc.Spec.Type = v1.ServiceTypeNodePort
	if svc, err = api.CreateService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := api.ApplySlice(ctx, kubeobj.Slice(svc, "np-ipv4", discoveryv1.AddressTypeIPv4,
		kubeobj.Endpoint{Addr: local.IPv4, NodeName: nodeName},
		kubeobj.Endpoint{Addr: l.remote.IPv4, NodeName: otherNode})); err != nil {
		t.Fatal(err)
	}
	nodePort := netip.AddrPortFrom(nodeAddrs[0].Addr(), uint16(svc.Spec.Ports[0].NodePort))
	waitWho(t, l.client.NetNS, nodePort, 2)

	held := holdConnections(t, l.client.NetNS, nodePort, 4)
	probes := startTimedProbes(l.client.NetNS, nodePort, 5*time.Millisecond)
	settle := func() { time.Sleep(500 * time.Millisecond) }
	settle()
	for round := 1; round <= 4; round++ {
		stop, how := kpr.Kill, "SIGKILL"
		if round%2 == 0 {
			stop, how = kpr.Stop, "SIGTERM"
		}
		if err := stop(); err != nil {
			t.Fatalf("round %d: stop kpr with %s: %v", round, how, err)
		}
		settle()
		started := time.Now()
		if err := kpr.Restart(); err != nil {
			t.Fatalf("round %d: restart kpr: %v", round, err)
		}
		if err := kpr.WaitSynced(ctx); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		t.Logf("round %d: stopped with %s, restarted and synced in %s", round, how, time.Since(started).Round(time.Millisecond))
		held.check(t, fmt.Sprintf("after restart %d", round))
		settle()
	}
	tally := probes.stop()
	t.Logf("%d connections to %s from outside through 4 restarts: %d failed, %d sent a packet again; answered by %v",
		tally.sent, nodePort, len(tally.failed), len(tally.slow), tally.who)
	if tally.sent < 100 {
		t.Errorf("only %d probes ran", tally.sent)
	}
	for _, what := range []struct {
		name string
		list []string
	}{{"failed", tally.failed}, {"lost a packet and sent it again", tally.slow}} {
		if len(what.list) > 0 {
			t.Errorf("%d connections %s, first ones:\n%s", len(what.list), what.name, strings.Join(first(what.list, 10), "\n"))
		}
	}
	if len(tally.who) != 2 {
		t.Errorf("the probes reached %v, want both the local and the remote backend", tally.who)
	}
	held.close()
}

func first(list []string, n int) []string {
	if len(list) > n {
		return list[:n]
	}
	return list
}

// heldConnections are long-lived connections through a frontend, each
// asked to echo a line at every check.
type heldConnections struct {
	conns []net.Conn
	who   []string
}

func holdConnections(t *testing.T, ns *harness.NetNS, fe netip.AddrPort, n int) *heldConnections {
	t.Helper()
	h := &heldConnections{}
	t.Cleanup(h.close)
	for i := 0; i < n; i++ {
		c, err := harness.DialTCP(ns, fe, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		h.conns = append(h.conns, c)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		who, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("held connection %d: read greeting: %v", i, err)
		}
		h.who = append(h.who, strings.TrimSpace(who))
	}
	h.check(t, "when opened")
	return h
}

// check has every connection echo a line, within a second.
func (h *heldConnections) check(t *testing.T, when string) {
	t.Helper()
	for i, c := range h.conns {
		line := fmt.Sprintf("held %d %s\n", i, when)
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte(line)); err != nil {
			t.Errorf("held connection %d to %s %s: write: %v", i, h.who[i], when, err)
			continue
		}
		buf := make([]byte, len(line))
		if _, err := readFull(c, buf); err != nil || string(buf) != line {
			t.Errorf("held connection %d to %s %s: echo %q, %v; want %q", i, h.who[i], when, buf, err, line)
		}
	}
}

func readFull(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (h *heldConnections) close() {
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.conns = nil
}

// timedProbes opens a connection to a frontend every interval and reads
// the greeting, noting each failure and each connection whose handshake
// lost a packet: the client sent its SYN again (TCP_INFO's
// tcpi_total_retrans), whether the SYN or the SYN-ACK was lost. Counting
// retransmissions rather than slow answers keeps a loaded machine's
// delays out of it.
type timedProbes struct {
	halt, done chan struct{}
	mu         sync.Mutex
	tally      probeTally
}

type probeTally struct {
	sent         int
	failed, slow []string
	who          map[string]int
}

func startTimedProbes(ns *harness.NetNS, fe netip.AddrPort, interval time.Duration) *timedProbes {
	p := &timedProbes{halt: make(chan struct{}), done: make(chan struct{}), tally: probeTally{who: map[string]int{}}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			start := time.Now()
			who, retrans, err := greetingAndRetransmits(ns, fe)
			took := time.Since(start)
			at := start.Format("15:04:05.000")
			p.mu.Lock()
			p.tally.sent++
			switch {
			case err != nil:
				p.tally.failed = append(p.tally.failed, fmt.Sprintf("%s after %s: %v", at, took.Round(time.Millisecond), err))
			case retrans > 0:
				p.tally.slow = append(p.tally.slow, fmt.Sprintf("%s: %s answered in %s after %d retransmissions", at, who, took.Round(time.Millisecond), retrans))
			}
			if err == nil {
				p.tally.who[who]++
			}
			p.mu.Unlock()
			select {
			case <-p.halt:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// greetingAndRetransmits connects to fe from ns, reads the echo server's
// greeting and returns it with the segments the client sent again.
func greetingAndRetransmits(ns *harness.NetNS, fe netip.AddrPort) (string, uint32, error) {
	c, err := harness.DialTCP(ns, fe, 5*time.Second)
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", 0, fmt.Errorf("read greeting from %s: %w", fe, err)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return "", 0, err
	}
	var info *unix.TCPInfo
	var infoErr error
	if err := raw.Control(func(fd uintptr) { info, infoErr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return "", 0, err
	}
	if infoErr != nil {
		return "", 0, fmt.Errorf("TCP_INFO: %w", infoErr)
	}
	return strings.TrimSpace(line), info.Total_retrans, nil
}

func (p *timedProbes) stop() probeTally {
	close(p.halt)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tally
}
