package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// udpChurnModes are the netfilter modes, where a UDP flow's backend is
// whatever its conntrack entry says until that entry is deleted. In the
// IPVS mode the flow also lives in IPVS's own connection table, which
// forgets it once its real server is deleted (expire_nodest_conn).
var udpChurnModes = []dataMode{modeIPTablesNFT, modeIPTablesLegacy, modeNFTables, modeIPVS}

// resolverInterval is how often a resolver asks, and answerBound how soon
// after an endpoint change it must be answered by a current endpoint.
const (
	resolverInterval = 50 * time.Millisecond
	answerBound      = 2 * time.Second
)

// TestUDPChurn runs resolvers that keep one source port each against a
// UDP ClusterIP while its server pods are replaced, and while kpr restarts
// as they are: each resolver must be answered by a current endpoint soon
// after every change, and never by a removed one once kpr is back.
func TestUDPChurn(t *testing.T) {
	forEachMode(t, udpChurnModes, func(t *testing.T, m dataMode) {
		f := newModeFixture(t, m)
		t.Run("server-cycling", func(t *testing.T) { testDNSServerCycling(t, f, f.namespace(t, "udp-cycling")) })
		t.Run("restart", func(t *testing.T) { testUDPRestartChurn(t, f, f.namespace(t, "udp-restart")) })
	})
}

// testDNSServerCycling replaces the DNS server pod over and over: through
// a moment with no endpoint (a pod deleted, its replacement not ready
// yet), and by surge (the replacement ready before the old one leaves).
// Each datagram that finds no rule for the ClusterIP, for however short a
// moment, leaves a conntrack entry without translation that the
// resolver's later datagrams follow; only its deletion lets them reach the
// new pod.
func testDNSServerCycling(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "dns", kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 53)
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	waitServes(t, udpWho, f.node.NetNS, vip, "pod-a")

	rs := f.startResolvers(t, vip)
	steps := [][]string{
		{}, {"pod-b"}, {}, {"pod-c"}, {"pod-c", "pod-a"}, {"pod-a"}, {}, {"pod-b"}, {}, {"pod-a"}, {"pod-a", "pod-c"}, {"pod-c"},
	}
	var changes []endpointChange
	for _, pods := range steps {
		at := time.Now()
		f.setEndpoints(t, svc, v4, f.eps(pods...)...)
		changes = append(changes, endpointChange{at: at, pods: pods})
		hold := answerBound + 500*time.Millisecond
		if len(pods) == 0 {
			hold = 300 * time.Millisecond
		}
		time.Sleep(hold)
	}
	end := time.Now()
	rs.stop()
	for _, r := range rs {
		for i, c := range changes {
			if len(c.pods) == 0 {
				continue
			}
			until := end
			if i+1 < len(changes) {
				until = changes[i+1].at
			}
			if err := r.servedAfter(c, until); err != nil {
				t.Errorf("%s, endpoints %v from %s: %v", r.name, c.pods, c.at.Format("15:04:05.000"), err)
			}
		}
		t.Logf("%s: %s", r.name, r.summary())
	}
}

// testUDPRestartChurn kills kpr, changes the endpoints while it is away
// and starts it again, a few times, and at last deletes the Service while
// it is away. While kpr is away its old rules and the resolvers' conntrack
// entries still lead to the removed pod; once it is back, no datagram may
// reach that pod.
func testUDPRestartChurn(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "dns", kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}))
	vip := clusterIP(t, svc, v1.IPv4Protocol, 53)
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	waitServes(t, udpWho, f.node.NetNS, vip, "pod-a")

	rs := f.startResolvers(t, vip)
	// Each round is checked from kpr's return to the next kill: while kpr
	// is away the removed pod may still answer.
	type round struct {
		back endpointChange
		end  time.Time
	}
	var rounds []round
	// The last round deletes the Service (nil): the new kpr never knew
	// it, and no pod may answer its ClusterIP once kpr is back.
	for _, pods := range [][]string{{"pod-b"}, {"pod-c"}, {"pod-a", "pod-b"}, {"pod-c"}, nil} {
		if err := f.kpr.Kill(); err != nil {
			t.Fatal(err)
		}
		if pods == nil {
			if err := f.client.CoreV1().Services(ns).Delete(f.ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			f.setEndpoints(t, svc, v4, f.eps(pods...)...)
		}
		time.Sleep(300 * time.Millisecond) // the resolvers go on meanwhile, through the old rules
		if err := f.kpr.Restart(); err != nil {
			t.Fatal(err)
		}
		f.waitHealthy()
		back := endpointChange{at: time.Now(), pods: pods}
		time.Sleep(answerBound)
		rounds = append(rounds, round{back: back, end: time.Now()})
	}
	rs.stop()
	for _, r := range rs {
		for _, rd := range rounds {
			if err := r.onlyServedBy(rd.back, rd.end); err != nil {
				t.Errorf("%s, kpr back at %s with endpoints %v: %v", r.name, rd.back.at.Format("15:04:05.000"), rd.back.pods, err)
			}
		}
		t.Logf("%s: %s", r.name, r.summary())
	}
	f.requireRunning(t)
}

// endpointChange is the endpoints a Service got at a time.
type endpointChange struct {
	at   time.Time
	pods []string
}

// resolver asks a UDP Service from one connected socket, so from one
// source port, every resolverInterval, as a stub resolver does, and
// records who answered each query.
type resolver struct {
	name    string
	conn    *net.UDPConn
	stopped chan struct{}  // closed by stop
	wg      sync.WaitGroup // the sender and the reader

	mu      sync.Mutex
	sent    []time.Time    // by query number
	answers map[int]string // query number -> pod
	errs    map[string]int // read errors by text
}

type resolvers []*resolver

// startResolvers starts two resolvers on the node and two in pod-d, which
// no scenario here uses as a server; each is stopped by the test's end.
// Their queries are spread over the interval, as independent clients'
// are, so that between them they cover a moment a single one may miss.
func (f *fixture) startResolvers(t *testing.T, vip netip.AddrPort) resolvers {
	t.Helper()
	var rs resolvers
	clients := []*harness.NetNS{f.node.NetNS, f.node.NetNS, f.pod("pod-d").NetNS, f.pod("pod-d").NetNS}
	for i, from := range clients {
		if i > 0 {
			time.Sleep(resolverInterval / time.Duration(len(clients)))
		}
		conn, err := harness.DialUDP(from, vip)
		if err != nil {
			t.Fatal(err)
		}
		r := &resolver{name: fmt.Sprintf("resolver %d in %s (%s)", i, from.Name, conn.LocalAddr()), conn: conn,
			answers: map[int]string{}, errs: map[string]int{}, stopped: make(chan struct{})}
		r.wg.Add(2)
		go r.send()
		go r.read()
		rs = append(rs, r)
	}
	t.Cleanup(rs.stop)
	return rs
}

// stop ends every resolver; calling it again does nothing.
func (rs resolvers) stop() {
	for _, r := range rs {
		r.mu.Lock()
		select {
		case <-r.stopped:
			r.mu.Unlock()
			continue
		default:
			close(r.stopped)
		}
		r.mu.Unlock()
		_ = r.conn.Close()
		r.wg.Wait()
	}
}

func (r *resolver) send() {
	defer r.wg.Done()
	tick := time.NewTicker(resolverInterval)
	defer tick.Stop()
	for n := 0; ; n++ {
		r.mu.Lock()
		r.sent = append(r.sent, time.Now())
		r.mu.Unlock()
		// A refused earlier query (no endpoints) fails this write once
		// without sending; the next tick sends again, as a resolver
		// retries.
		_, _ = r.conn.Write([]byte("q-" + strconv.Itoa(n)))
		select {
		case <-r.stopped:
			return
		case <-tick.C:
		}
	}
}

func (r *resolver) read() {
	defer r.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, err := r.conn.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.mu.Lock()
			r.errs[err.Error()]++
			r.mu.Unlock()
			continue
		}
		pod, query, ok := bytes.Cut(buf[:n], []byte("\n"))
		q, convErr := strconv.Atoi(string(bytes.TrimPrefix(query, []byte("q-"))))
		if !ok || convErr != nil {
			continue
		}
		r.mu.Lock()
		r.answers[q] = string(pod)
		r.mu.Unlock()
	}
}

// servedAfter checks the queries sent between c.at and until: one sent
// within answerBound of c.at is answered by one of c.pods, and none sent
// after that is answered by another pod.
func (r *resolver) servedAfter(c endpointChange, until time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	firstOK := time.Time{}
	for q, at := range r.sent {
		if at.Before(c.at) || !at.Before(until) {
			continue
		}
		who, answered := r.answers[q]
		switch {
		case answered && contains(c.pods, who):
			if firstOK.IsZero() {
				firstOK = at
			}
		case answered && at.Sub(c.at) > answerBound:
			return fmt.Errorf("query %d sent %s after the change was answered by %s", q, at.Sub(c.at).Round(time.Millisecond), who)
		}
	}
	if firstOK.IsZero() || firstOK.Sub(c.at) > answerBound {
		return fmt.Errorf("no query sent within %s of the change was answered by %v (first such answer: %s)",
			answerBound, c.pods, describeFirst(firstOK, c.at))
	}
	return nil
}

// onlyServedBy checks the queries sent between b.at and until: every
// answer comes from one of b.pods, and some do (none with no pods).
func (r *resolver) onlyServedBy(b endpointChange, until time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	served, wrong := 0, map[string]int{}
	for q, at := range r.sent {
		if at.Before(b.at) || !at.Before(until) {
			continue
		}
		who, answered := r.answers[q]
		switch {
		case !answered:
		case contains(b.pods, who):
			served++
		default:
			wrong[who]++
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("queries answered by removed backends %v (and %d by current ones)", wrong, served)
	}
	if served == 0 && len(b.pods) > 0 {
		return fmt.Errorf("no query was answered by %v", b.pods)
	}
	return nil
}

func (r *resolver) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d queries, %d answered, read errors %v", len(r.sent), len(r.answers), r.errs)
}

func describeFirst(first, since time.Time) string {
	if first.IsZero() {
		return "none"
	}
	return first.Sub(since).Round(time.Millisecond).String() + " after it"
}
