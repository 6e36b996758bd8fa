package e2e

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
)

// dialTimeout bounds one probe. Translation happens inside connect(), so a
// healthy probe takes well under a millisecond; the slack is for a loaded
// machine.
const dialTimeout = 2 * time.Second

// convergeTimeout bounds how long kpr may take to act on an API change in
// the scenarios that do not measure it. kpr syncs within milliseconds; the
// slack is for a 2-core machine shared with other jobs.
const convergeTimeout = 15 * time.Second

// prober connects to a Service address from a namespace and returns the
// name of the pod that answered.
type prober func(ns *harness.NetNS, addr netip.AddrPort) (string, error)

// tcpWho reads the greeting of the pods' TCP echo servers.
func tcpWho(ns *harness.NetNS, addr netip.AddrPort) (string, error) {
	return harness.WhoTCP(ns, addr, dialTimeout)
}

// udpWho sends one datagram from an unconnected socket and checks that the
// reply comes from the Service address, as a client expects.
func udpWho(ns *harness.NetNS, addr netip.AddrPort) (string, error) {
	who, from, err := harness.WhoUDP(ns, addr, dialTimeout)
	if err != nil {
		return "", err
	}
	if from.Addr().Unmap() != addr.Addr() || from.Port() != addr.Port() {
		return "", fmt.Errorf("UDP reply from %s came from %s, want the Service address", who, from)
	}
	return who, nil
}

// httpWho fetches / from the pods' HTTP servers ("hello from <pod>").
func httpWho(ns *harness.NetNS, addr netip.AddrPort) (string, error) {
	body, err := harness.HTTPGet(ns, addr, "/", dialTimeout)
	if err != nil {
		return "", err
	}
	name, ok := strings.CutPrefix(strings.TrimSpace(body), "hello from ")
	if !ok {
		return "", fmt.Errorf("GET %s answered %q, not an HTTP backend's greeting", addr, body)
	}
	return name, nil
}

// sample makes n probes and counts who answered; the first failure ends it.
func sample(probe prober, ns *harness.NetNS, addr netip.AddrPort, n int) (map[string]int, error) {
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		who, err := probe(ns, addr)
		if err != nil {
			return seen, fmt.Errorf("probe %d of %d: %w", i+1, n, err)
		}
		seen[who]++
	}
	return seen, nil
}

// roundSize is the number of probes in which every one of up to four
// equally likely backends shows up, but for a chance of 4*(3/4)^40 < 1e-4,
// and any removed one would have shown up too.
const roundSize = 40

// waitServes waits until a round of probes succeeds and is answered by
// exactly the pods in want.
func waitServes(t *testing.T, probe prober, ns *harness.NetNS, addr netip.AddrPort, want ...string) {
	t.Helper()
	waitServesWithin(t, convergeTimeout, probe, ns, addr, want...)
}

// waitServesWithin is waitServes with its own deadline.
func waitServesWithin(t *testing.T, timeout time.Duration, probe prober, ns *harness.NetNS, addr netip.AddrPort, want ...string) {
	t.Helper()
	slices.Sort(want)
	waitUntil(t, timeout, fmt.Sprintf("%s served by exactly %v from %s", addr, want, ns.Name), func() error {
		seen, err := sample(probe, ns, addr, roundSize)
		if err != nil {
			return err
		}
		if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, want) {
			return fmt.Errorf("answered by %v", seen)
		}
		return nil
	})
}

// requireServes is waitServes without waiting: the Service must already be
// served by exactly want.
func requireServes(t *testing.T, probe prober, ns *harness.NetNS, addr netip.AddrPort, want ...string) {
	t.Helper()
	slices.Sort(want)
	seen, err := sample(probe, ns, addr, roundSize)
	if err != nil {
		t.Fatalf("%s from %s: %v", addr, ns.Name, err)
	}
	if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, want) {
		t.Fatalf("%s from %s answered by %v, want exactly %v", addr, ns.Name, seen, want)
	}
}

// dialErr connects once (TCP, or a connected UDP socket) and returns the
// error, nil if the connect succeeded. A UDP socket also sends a datagram
// and waits briefly for the answer: where no connect() hook refuses it
// (the iptables mode), the refusal comes back as an ICMP error, which the
// next receive returns as ECONNREFUSED; a backend's echo is success.
func dialErr(ns *harness.NetNS, addr netip.AddrPort, udp bool) error {
	if udp {
		c, err := harness.DialUDP(ns, addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("refused?")); err != nil {
			return sendError{err}
		}
		if err := c.SetReadDeadline(time.Now().Add(dialTimeout)); err != nil {
			return err
		}
		_, err = c.Read(make([]byte, 512))
		return err
	}
	c, err := harness.DialTCP(ns, addr, dialTimeout)
	if err == nil {
		c.Close()
	}
	return err
}

// sendError is a datagram's send failing after its socket connected.
type sendError struct{ error }

func (e sendError) Unwrap() error { return e.error }

// refused says whether err is how a Service without endpoints answers: a
// connect (or a UDP reply) with ECONNREFUSED, or, for UDP under the
// iptables mode, the send itself with EPERM: the REJECT rule in filter
// OUTPUT drops a node socket's datagram there, as under kube-proxy.
func refused(err error) bool {
	var send sendError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &send) && errors.Is(err, syscall.EPERM))
}

// waitRefused waits until a connect to addr fails at once with
// ECONNREFUSED, the way kube-proxy's REJECT rule answers a Service without
// endpoints, and checks that it keeps doing so.
//
// In the iptables and IPVS modes the rejection of a pod's connect is an
// ICMP error (IPVS sends port unreachable for a virtual server without
// real servers) that the kernel rate-limits per peer (a burst of 6, then
// one a second), so a SYN whose rejection was held back is retransmitted
// after 1 s and rejected then, as under kube-proxy; the bound allows that
// one retransmission. The eBPF mode refuses inside connect() itself.
func (f *fixture) waitRefused(t *testing.T, ns *harness.NetNS, addr netip.AddrPort, udp bool) {
	t.Helper()
	waitUntil(t, convergeTimeout, fmt.Sprintf("connects to %s from %s refused", addr, ns.Name), func() error {
		err := dialErr(ns, addr, udp)
		if refused(err) {
			return nil
		}
		return fmt.Errorf("connect returned %v", err)
	})
	for i := 0; i < 10; i++ {
		start := time.Now()
		err := dialErr(ns, addr, udp)
		if !refused(err) {
			t.Fatalf("connect %d to %s: %v, want ECONNREFUSED", i, addr, err)
		}
		// A SYN that went out and was answered by a RST would also give
		// ECONNREFUSED; a rejection in connect() itself is immediate.
		bound := time.Second
		if !f.mode.ebpf() {
			bound = 2500 * time.Millisecond
		}
		if took := time.Since(start); took > bound {
			t.Fatalf("connect %d to %s took %s to be refused, want at once (within %s)", i, addr, took, bound)
		}
	}
}

// requireUntranslated checks that kpr leaves addr alone. In the eBPF mode
// the node has no route to the Service CIDRs, so an untranslated connect
// fails with ENETUNREACH where a translated one would reach a pod or be
// refused. The iptables and IPVS modes need the route (nat OUTPUT and
// IPVS's LOCAL_OUT hook come after the route lookup), which leads nowhere:
// an untranslated connect times out or finds no host.
func (f *fixture) requireUntranslated(t *testing.T, ns *harness.NetNS, addr netip.AddrPort) {
	t.Helper()
	// A socket the hooks serve fails in connect(), with no route; a pod's
	// packet leaves by its default route and dies on the node.
	if f.mode.ebpf() && ns == f.node.NetNS {
		err := dialErr(ns, addr, false)
		if !errors.Is(err, syscall.ENETUNREACH) {
			t.Fatalf("connect to %s from %s: %v, want ENETUNREACH (address not translated by kpr)", addr, ns.Name, err)
		}
		return
	}
	c, err := harness.DialTCP(ns, addr, 500*time.Millisecond)
	if err == nil {
		c.Close()
		t.Fatalf("connect to %s from %s succeeded, want it untranslated (no answer)", addr, ns.Name)
	}
	var nerr net.Error
	if !(errors.As(err, &nerr) && nerr.Timeout()) && !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("connect to %s from %s: %v, want a timeout or EHOSTUNREACH (address not translated by kpr)", addr, ns.Name, err)
	}
}
