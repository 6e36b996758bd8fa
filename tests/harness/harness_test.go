package harness_test

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/kpr-io/kpr/tests/harness"
)

const timeout = 2 * time.Second

// slowConnect is far above a local connect (well under 10ms) and below the
// 1s retransmit that a lost SYN or neighbour solicitation costs.
const slowConnect = 500 * time.Millisecond

// newNodeWithPods builds a node with one pod per name, each running TCP and
// UDP echo servers on port 8080.
func newNodeWithPods(t *testing.T, names ...string) (*harness.Node, []*harness.Pod) {
	t.Helper()
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatalf("NewNode: %v", err)
	}
	var pods []*harness.Pod
	for _, name := range names {
		p, err := node.AddPod(name)
		if err != nil {
			t.Fatalf("AddPod(%s): %v", name, err)
		}
		if _, err := p.ServeTCP(8080); err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeUDP(8080); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	return node, pods
}

// checkWho asserts that TCP, unconnected UDP and connected UDP from ns to
// every address of want, port 8080, are answered by want, and that UDP
// replies come from the address that was asked. Connections must be quick
// even right after setup: a packet lost to a link or address that was not
// fully ready shows up as a 1s retransmit.
func checkWho(t *testing.T, ns *harness.NetNS, want *harness.Pod) {
	t.Helper()
	for _, ip := range want.Addrs() {
		addr := netip.AddrPortFrom(ip, 8080)
		start := time.Now()
		if got, err := harness.WhoTCP(ns, addr, timeout); err != nil || got != want.Name {
			t.Errorf("WhoTCP(%s, %s) = %q, %v; want %q", ns.Name, addr, got, err, want.Name)
		}
		if d := time.Since(start); d > slowConnect {
			t.Errorf("WhoTCP(%s, %s) took %s; a first packet was probably dropped", ns.Name, addr, d)
		}
		got, from, err := harness.WhoUDP(ns, addr, timeout)
		if err != nil || got != want.Name {
			t.Errorf("WhoUDP(%s, %s) = %q, %v; want %q", ns.Name, addr, got, err, want.Name)
		}
		if err == nil && from != addr {
			t.Errorf("WhoUDP(%s, %s): reply came from %s, want %s", ns.Name, addr, from, addr)
		}
		if got, err := harness.WhoUDPConnected(ns, addr, timeout); err != nil || got != want.Name {
			t.Errorf("WhoUDPConnected(%s, %s) = %q, %v; want %q", ns.Name, addr, got, err, want.Name)
		}
	}
}

func TestNodeReachesEveryPodOnBothFamilies(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	node, pods := newNodeWithPods(t, "a", "b", "c")

	wantV4 := []string{"10.244.0.2", "10.244.0.3", "10.244.0.4"}
	wantV6 := []string{"fd00:244::2", "fd00:244::3", "fd00:244::4"}
	for i, p := range pods {
		if p.IPv4.String() != wantV4[i] || p.IPv6.String() != wantV6[i] {
			t.Errorf("pod %s got %s and %s, want %s and %s", p.Name, p.IPv4, p.IPv6, wantV4[i], wantV6[i])
		}
	}
	for _, p := range pods {
		checkWho(t, node.NetNS, p)
	}
	// Traffic must have reached the addressed pod and no other: per pod,
	// one TCP connection per family and two datagrams per family.
	for _, p := range pods {
		for _, s := range p.Servers() {
			want := map[harness.Protocol]int64{harness.TCP: 2, harness.UDP: 4}[s.Proto]
			if s.Hits() != want {
				t.Errorf("pod %s %s server: %d hits, want %d", p.Name, s.Proto, s.Hits(), want)
			}
		}
	}
}

func TestPodReachesPod(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	_, pods := newNodeWithPods(t, "client", "server")
	client, server := pods[0], pods[1]
	checkWho(t, client.NetNS, server)

	// The TCP server echoes after the greeting, and the connection is seen
	// by the server as coming from the client pod (no NAT in between).
	for _, ip := range server.Addrs() {
		c, err := harness.DialTCP(client.NetNS, netip.AddrPortFrom(ip, 8080), timeout)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(timeout))
		if local := netip.MustParseAddrPort(c.LocalAddr().String()).Addr(); !slices.Contains(client.Addrs(), local) {
			t.Errorf("connection to %s left from %s, not from the client pod %v", ip, local, client.Addrs())
		}
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || line != "server\n" {
			t.Errorf("greeting = %q, %v", line, err)
		}
		if _, err := io.WriteString(c, "ping"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "ping" {
			t.Errorf("echo = %q, %v; want \"ping\"", buf, err)
		}
		c.Close()
	}
}

func TestHTTPServer(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := node.AddPod("web")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := p.ServeHTTP(80)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range p.Addrs() {
		addr := netip.AddrPortFrom(ip, 80)
		if body, err := harness.HTTPGet(node.NetNS, addr, "/", timeout); err != nil || body != "hello from web\n" {
			t.Errorf("GET / on %s = %q, %v", addr, body, err)
		}
		if _, err := harness.HTTPGet(node.NetNS, addr, "/nope", timeout); err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("GET /nope on %s: err = %v, want a 404 error", addr, err)
		}
	}
	if srv.Hits() != 4 {
		t.Errorf("HTTP hits = %d, want 4", srv.Hits())
	}
	if old := srv.ResetHits(); old != 4 || srv.Hits() != 0 {
		t.Errorf("ResetHits returned %d and left %d; want 4 and 0", old, srv.Hits())
	}
}

func TestStoppedServersRefuse(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	node, pods := newNodeWithPods(t, "p")
	p := pods[0]
	addr := netip.AddrPortFrom(p.IPv4, 8080)
	if _, err := harness.WhoTCP(node.NetNS, addr, timeout); err != nil {
		t.Fatalf("before stop: %v", err)
	}
	// An open connection must be cut by StopServers too.
	open, err := harness.DialTCP(node.NetNS, addr, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := p.StopServers(); err != nil {
		t.Fatal(err)
	}
	if len(p.Servers()) != 0 {
		t.Errorf("Servers() after StopServers = %d, want 0", len(p.Servers()))
	}
	_ = open.SetReadDeadline(time.Now().Add(timeout))
	if _, err := io.ReadAll(open); err != nil {
		t.Errorf("open connection was not closed by StopServers: %v", err)
	}
	if name, err := harness.WhoTCP(node.NetNS, addr, timeout); err == nil {
		t.Errorf("WhoTCP after StopServers answered %q", name)
	}
	if name, _, err := harness.WhoUDP(node.NetNS, addr, 300*time.Millisecond); err == nil {
		t.Errorf("WhoUDP after StopServers answered %q", name)
	}
	// The port is free again.
	if _, err := p.ServeTCP(8080); err != nil {
		t.Errorf("ServeTCP again after stop: %v", err)
	}
}

func TestNodeAddressReachableFromPod(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := node.AddPod("p")
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"192.168.100.10/24", "fd00:100::10/64"} {
		pfx := netip.MustParsePrefix(prefix)
		if err := node.AddAddress(pfx); err != nil {
			t.Fatal(err)
		}
		// A host-network listener on the node IP, reached from the pod via
		// its default route.
		var l net.Listener
		err := harness.Do(node.NetNS, func() (err error) {
			l, err = net.Listen("tcp", netip.AddrPortFrom(pfx.Addr(), 30080).String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		accepted := make(chan netip.Addr, 1)
		go func() {
			c, err := l.Accept()
			if err == nil {
				accepted <- netip.MustParseAddrPort(c.RemoteAddr().String()).Addr()
				c.Close()
			}
			close(accepted)
		}()
		start := time.Now()
		c, err := harness.DialTCP(p.NetNS, netip.AddrPortFrom(pfx.Addr(), 30080), timeout)
		if d := time.Since(start); d > slowConnect {
			t.Errorf("pod -> node address %s took %s; a first packet was probably dropped", pfx.Addr(), d)
		}
		if err != nil {
			t.Errorf("pod -> node address %s: %v", pfx.Addr(), err)
		} else {
			c.Close()
			if from := <-accepted; !slices.Contains(p.Addrs(), from) {
				t.Errorf("node saw connection from %s, want one of the pod's %v", from, p.Addrs())
			}
		}
		l.Close()
	}
}

func TestOptionsAreValidated(t *testing.T) {
	for name, opts := range map[string]harness.Options{
		"gateway is the network address": {GatewayV4: netip.MustParsePrefix("10.1.0.0/24")},
		"IPv6 gateway given as IPv4":     {GatewayV6: netip.MustParsePrefix("10.1.0.1/24")},
		"IPv4 gateway given as IPv6":     {GatewayV4: netip.MustParsePrefix("fd00::1/64")},
		"bridge and uplink share a name": {BridgeName: "br", UplinkName: "br"},
		"interface name too long":        {BridgeName: "a-very-long-bridge-name"},
	} {
		if _, err := harness.NewNode(t, opts); err == nil {
			t.Errorf("%s: NewNode accepted %+v", name, opts)
		}
	}
}

func TestAddPodValidatesAndRemovePodDeletes(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	node, err := harness.NewNode(t, harness.Options{
		GatewayV4: netip.MustParsePrefix("10.99.0.1/29"),
		GatewayV6: netip.MustParsePrefix("fd00:99::1/120"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "Upper", "has_underscore", "-lead", strings.Repeat("x", 33)} {
		if _, err := node.AddPod(bad); err == nil {
			t.Errorf("AddPod(%q) succeeded, want an error", bad)
		}
	}
	p, err := node.AddPod("x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.AddPod("x"); err == nil {
		t.Error("AddPod with a duplicate name succeeded")
	}
	if p.IPv4.String() != "10.99.0.2" || p.IPv6.String() != "fd00:99::2" {
		t.Errorf("pod addresses %s %s, want 10.99.0.2 fd00:99::2", p.IPv4, p.IPv6)
	}
	if _, err := os.Stat(p.NetNS.Path); err != nil {
		t.Fatalf("pod netns not pinned: %v", err)
	}
	if l, err := node.NetNS.Netlink().LinkByIndex(p.HostVethIndex); err != nil || l.Attrs().Name != p.HostVeth || l.Attrs().MasterIndex != node.BridgeIndex {
		t.Errorf("HostVethIndex %d does not name %s, a port of %s: %v", p.HostVethIndex, p.HostVeth, node.Bridge, err)
	}
	if l, err := p.NetNS.Netlink().LinkByIndex(p.EthIndex); err != nil || l.Attrs().Name != "eth0" {
		t.Errorf("EthIndex %d is not eth0 in the pod: %v", p.EthIndex, err)
	}
	if err := node.RemovePod("x"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.NetNS.Path); !os.IsNotExist(err) {
		t.Errorf("after RemovePod, %s still exists (err %v)", p.NetNS.Path, err)
	}
	if _, err := node.NetNS.Netlink().LinkByName(p.HostVeth); err == nil {
		t.Errorf("after RemovePod, host veth %s still exists", p.HostVeth)
	}
	if node.Pod("x") != nil || len(node.Pods()) != 0 {
		t.Error("removed pod still listed")
	}
	// The name is free again but addresses are not recycled; the /29 holds
	// .2 to .6, so after .2 (removed) and .3 to .6 the subnet is exhausted.
	for i, want := range []string{"10.99.0.3", "10.99.0.4", "10.99.0.5", "10.99.0.6"} {
		q, err := node.AddPod("x" + string(rune('a'+i)))
		if err != nil {
			t.Fatalf("AddPod #%d: %v", i, err)
		}
		if q.IPv4.String() != want {
			t.Errorf("pod %s got %s, want %s", q.Name, q.IPv4, want)
		}
	}
	if _, err := node.AddPod("x"); err == nil || !strings.Contains(err.Error(), "out of addresses") {
		t.Errorf("AddPod on a full subnet: err = %v, want out of addresses", err)
	}
}

// TestCleanupDeletesEverything runs a whole topology in a subtest and checks
// that its cleanup removed every namespace, while the caller's thread never
// left its namespace and the host gained no interface.
func TestCleanupDeletesEverything(t *testing.T) {
	harness.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	hostLinks := linkNames(t)

	var paths []string
	t.Run("topology", func(t *testing.T) {
		node, pods := newNodeWithPods(t, "a", "b")
		if _, err := pods[0].ServeHTTP(80); err != nil {
			t.Fatal(err)
		}
		checkWho(t, node.NetNS, pods[1])
		paths = append(paths, node.NetNS.Path)
		for _, p := range pods {
			paths = append(paths, p.NetNS.Path)
		}
		listed := ipNetnsList(t)
		for _, p := range paths {
			name := filepath.Base(p)
			if !strings.HasPrefix(name, harness.NamePrefix) {
				t.Errorf("namespace %s lacks the %q prefix", name, harness.NamePrefix)
			}
			if !slices.Contains(listed, name) {
				t.Errorf("`ip netns list` does not show %s while the test runs: %v", name, listed)
			}
		}
	})
	if len(paths) != 3 {
		t.Fatalf("subtest recorded %d namespaces, want 3", len(paths))
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists after cleanup (err %v)", p, err)
		}
	}
	listed := ipNetnsList(t)
	for _, p := range paths {
		if slices.Contains(listed, filepath.Base(p)) {
			t.Errorf("`ip netns list` still shows %s", filepath.Base(p))
		}
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(before) {
		t.Errorf("calling thread ended in netns %s, started in %s", after, before)
	}
	if got := linkNames(t); !slices.Equal(got, hostLinks) {
		t.Errorf("host interfaces changed: before %v, after %v", hostLinks, got)
	}
}

func ipNetnsList(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// linkNames lists the interfaces of the calling thread's namespace.
func linkNames(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

func TestDo(t *testing.T) {
	harness.RequireRoot(t)
	t.Parallel()
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Inside Do, the thread sees the node's interfaces (the bridge).
	err = harness.Do(node.NetNS, func() error {
		_, err := netlink.LinkByName(node.Bridge)
		return err
	})
	if err != nil {
		t.Errorf("bridge %s not visible inside Do: %v", node.Bridge, err)
	}
	// A child process started through StartCommand runs in the namespace.
	out := new(strings.Builder)
	cmd := exec.Command("ip", "-o", "link", "show", "dev", node.Bridge)
	cmd.Stdout = out
	if err := harness.StartCommand(node.NetNS, cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), node.Bridge) {
		t.Errorf("`ip link show %s` in the node netns: %v, output %q", node.Bridge, err, out)
	}
	// Errors and panics of fn reach the caller.
	if err := harness.Do(node.NetNS, func() error { return io.ErrUnexpectedEOF }); err != io.ErrUnexpectedEOF {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the panic of fn", r)
			}
		}()
		_ = harness.Do(node.NetNS, func() error { panic("boom") })
	}()
}

func TestCgroupEnterAndLeave(t *testing.T) {
	harness.RequireRoot(t)
	home := ownCgroup(t, os.Getpid())

	// A child process added with AddPID and still alive at cleanup must be
	// moved out so the directory can go.
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	})

	var cgPath string
	t.Run("cgroup", func(t *testing.T) {
		cg, err := harness.NewCgroup(t)
		if err != nil {
			t.Fatal(err)
		}
		cgPath = cg.Path
		mount, err := harness.Cgroup2Mount()
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(cg.Path) != mount || !strings.HasPrefix(filepath.Base(cg.Path), "kpr-test-") {
			t.Errorf("cgroup path %s, want %s/kpr-test-<rand>", cg.Path, mount)
		}
		var st os.FileInfo
		if st, err = os.Stat(cg.Path); err != nil || !st.IsDir() {
			t.Fatalf("cgroup dir: %v", err)
		}
		if cg.FD() < 0 {
			t.Errorf("FD() = %d", cg.FD())
		}
		if err := cg.EnterProcess(); err != nil {
			t.Fatal(err)
		}
		want := "/" + filepath.Base(cg.Path)
		if got := ownCgroup(t, os.Getpid()); got != want {
			t.Errorf("after EnterProcess, in cgroup %s, want %s", got, want)
		}
		if err := cg.AddPID(child.Process.Pid); err != nil {
			t.Fatal(err)
		}
		pids, err := cg.PIDs()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pids, os.Getpid()) || !slices.Contains(pids, child.Process.Pid) {
			t.Errorf("cgroup.procs = %v, want the test process %d and child %d", pids, os.Getpid(), child.Process.Pid)
		}
	})
	if got := ownCgroup(t, os.Getpid()); got != home {
		t.Errorf("after cleanup the test process is in %s, want %s", got, home)
	}
	if got := ownCgroup(t, child.Process.Pid); got != home {
		t.Errorf("after cleanup the child is in %s, want %s", got, home)
	}
	if _, err := os.Stat(cgPath); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still exists after cleanup (err %v)", cgPath, err)
	}
}

// ownCgroup returns the cgroup v2 path of pid.
func ownCgroup(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return rel
		}
	}
	t.Fatalf("no 0:: line in /proc/%d/cgroup", pid)
	return ""
}
