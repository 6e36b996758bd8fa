package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// traceEvent is the part of a `kpr trace -o json` line the test reads.
type traceEvent struct {
	Hook     string `json:"hook"`
	Frontend string `json:"frontend"`
	Backend  string `json:"backend"`
	Verdict  string `json:"verdict"`
}

// TestTraceService: `kpr trace --service ns/name` finds the Service's
// frontends through the API and streams the running daemon's decisions
// about them, and only them; the daemon's metrics count the same
// translations.
func TestTraceService(t *testing.T) {
	f := newFixture(t)
	ns := f.namespace(t, "trace")
	web := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	f.setEndpoints(t, web, v4, f.ep("pod-a", v4))
	other := f.createService(t, kubeobj.Service(ns, "other", tcp80))
	f.setEndpoints(t, other, v4, f.ep("pod-b", v4))
	webVIP, otherVIP := clusterIP(t, web, v1.IPv4Protocol, 80), clusterIP(t, other, v1.IPv4Protocol, 80)
	for vip, pod := range map[netip.AddrPort]string{webVIP: "pod-a", otherVIP: "pod-b"} {
		waitUntil(t, convergeTimeout, "Service at "+vip.String(), func() error {
			who, err := tcpWho(f.node.NetNS, vip)
			if err == nil && who != pod {
				err = fmt.Errorf("reached %s, want %s", who, pod)
			}
			return err
		})
	}
	translated := func() float64 {
		v, err := f.kpr.Metric(`kpr_sock_translations_total{hook="connect4"}`)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := translated()

	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "trace", "--service", ns+"/web", "-o", "json", "--bpf-root", f.kpr.BPFRoot,
		"--kubeconfig", f.cluster.KubeconfigPath, "--hostname-override", nodeName)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	if line, err := bufio.NewReader(stderr).ReadString('\n'); err != nil || !strings.Contains(line, webVIP.String()) {
		t.Fatalf("kpr trace --service %s/web: %q, %v; want it to trace %s", ns, line, err, webVIP)
	}
	events := make(chan traceEvent, 10)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev traceEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
		close(events)
	}()

	// web, other, web: the second web event proves other left none.
	for _, vip := range []netip.AddrPort{webVIP, otherVIP, webVIP} {
		if _, err := tcpWho(f.node.NetNS, vip); err != nil {
			t.Fatal(err)
		}
	}
	backend := netip.AddrPortFrom(f.pod("pod-a").IPv4, tcpPort).String()
	for i := 0; i < 2; i++ {
		select {
		case ev := <-events:
			if ev.Frontend != webVIP.String() || ev.Verdict != "translated" || ev.Backend != backend || ev.Hook != "connect4" {
				t.Fatalf("trace event %d = %+v, want connect4 %s translated to %s (never %s)", i, ev, webVIP, backend, otherVIP)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("trace event %d: none within 5s", i)
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kpr trace after SIGINT: %v", err)
	}
	// Only the test connects to Service addresses in the cgroup.
	if d := translated() - before; d != 3 {
		t.Errorf("kpr_sock_translations_total{hook=\"connect4\"} grew by %v over 3 connects to Services, want 3", d)
	}
}

// TestTraceCount: `kpr trace --count N` ends by itself, with exit 0, once
// it has written N decisions, so that a script can wait for the next
// connect() to a Service without sending a signal.
func TestTraceCount(t *testing.T) {
	f := newFixture(t)
	ns := f.namespace(t, "trace-count")
	web := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	f.setEndpoints(t, web, v4, f.ep("pod-a", v4))
	vip := clusterIP(t, web, v1.IPv4Protocol, 80)
	waitUntil(t, convergeTimeout, "Service at "+vip.String(), func() error {
		_, err := tcpWho(f.node.NetNS, vip)
		return err
	})

	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "trace", "--frontend", vip.String(), "--count", "2", "--bpf-root", f.kpr.BPFRoot)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	ended := false
	defer func() {
		if !ended {
			cmd.Process.Kill()
			<-exited
		}
	}()
	if _, err := bufio.NewReader(stderr).ReadString('\n'); err != nil {
		t.Fatalf("kpr trace wrote no header: %v", err)
	}
	lines := make(chan []string, 1)
	go func() {
		var got []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got = append(got, sc.Text())
		}
		lines <- got
		exited <- cmd.Wait()
	}()
	for i := 0; i < 2; i++ {
		if _, err := tcpWho(f.node.NetNS, vip); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case got := <-lines:
		if len(got) != 2 || !strings.Contains(got[0], "translated") {
			t.Errorf("kpr trace --count 2 wrote %q, want two translated decisions", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kpr trace --count 2 still runs 10s after two connects")
	}
	err = <-exited
	ended = true
	if err != nil {
		t.Errorf("kpr trace --count 2: %v, want exit 0", err)
	}
}
