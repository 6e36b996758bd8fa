package tcnat

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// `kpr run` without --devices, against a real API server: the tc programs
// go to the node's device that carries its addresses (ext0, the uplink
// with the default route) and to no bridge or pod device; a NodePort is
// served from outside; an address added to the node at runtime serves the
// NodePort within seconds, without a restart, and a new device gets the
// programs. `kpr dump --conntrack` lists a live flow, and the metrics show
// its conntrack entries and a drop reason.
func TestKprRunFollowsNodeDevicesAndAddresses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName = "kpr-tcnat-follow"
	cl, api := testCluster(ctx, t, nodeName)
	top := buildTopology(t, 2)
	nl := top.node.NetNS.Netlink()
	ext, err := nl.LinkByName(extDev)
	if err != nil {
		t.Fatal(err)
	}
	// As on a real node, the default route leaves through the uplink.
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: ext.Attrs().Index, Gw: clientAddrs[0].Addr().AsSlice()}); err != nil {
		t.Fatalf("default route in the node namespace: %v", err)
	}
	// No --devices: kpr finds them.
	kpr := runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--tc-attach", "auto")

	t.Run("attaches to the device with node addresses only", func(t *testing.T) {
		if s := deviceState(t, top.node.NetNS, extDev); len(s.tcx["ingress"]) != 1 || len(s.tcx["egress"]) != 1 {
			t.Errorf("%s carries tcx programs %v, want kpr's ingress and egress", extDev, s.tcx)
		}
		others := []string{top.node.Bridge}
		for _, p := range top.pods {
			others = append(others, p.HostVeth)
		}
		for _, dev := range others {
			if s := deviceState(t, top.node.NetNS, dev); !s.empty() {
				t.Errorf("%s (a bridge or pod device) carries tc programs: %+v", dev, s)
			}
		}
	})

	const ns = "tcnat"
	onNode := createNodePort(ctx, t, api, ns, nodeName, top.pods...)
	nodePort := onNode.Port()

	t.Run("serves a NodePort from outside", func(t *testing.T) {
		waitWho(t, top.client.NetNS, onNode, 2)
	})

	t.Run("a new address serves the NodePort without a restart", func(t *testing.T) {
		added := netip.MustParsePrefix("192.168.100.11/24")
		if err := top.node.AddAddress(added); err != nil {
			t.Fatal(err)
		}
		fe := netip.AddrPortFrom(added.Addr(), nodePort)
		start := time.Now()
		if err := answersWithin(top.client.NetNS, fe, 5*time.Second); err != nil {
			t.Fatalf("NodePort on the new address %s: %v", fe, err)
		}
		t.Logf("NodePort answered on the new address %s after %v", fe, time.Since(start).Round(time.Millisecond))
	})

	t.Run("a new device gets the programs", func(t *testing.T) {
		// A veth pair standing in for a second NIC (this kernel may lack
		// the dummy driver); a veth counts once a default route leaves
		// through it.
		dev := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ext1"}, PeerName: "ext1-peer"}
		if err := nl.LinkAdd(dev); err != nil {
			t.Fatal(err)
		}
		defer nl.LinkDel(dev)
		peer, err := nl.LinkByName("ext1-peer")
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.AddrAdd(dev, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.7"), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatal(err)
		}
		for _, l := range []netlink.Link{peer, dev} {
			if err := nl.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		if err := nl.RouteAdd(&netlink.Route{LinkIndex: dev.Attrs().Index, Priority: 2048,
			Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}); err != nil {
			t.Fatalf("IPv6 default route through ext1: %v", err)
		}
		attached := func() bool { s := deviceState(t, top.node.NetNS, "ext1"); return len(s.tcx["ingress"]) == 1 }
		if !eventually(5*time.Second, attached) {
			t.Fatal("a new device with a node address got no tc programs within 5s")
		}
		// Down, it is no node device any more.
		if err := nl.LinkSetDown(dev); err != nil {
			t.Fatal(err)
		}
		if !eventually(5*time.Second, func() bool { return deviceState(t, top.node.NetNS, "ext1").empty() }) {
			t.Error("a device set down kept its tc programs for 5s")
		}
	})

	// A flow kept open, for the dump and the metrics.
	conn, err := harness.DialTCP(top.client.NetNS, onNode, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	dialed := time.Now()
	defer conn.Close()
	client := conn.LocalAddr().(*net.TCPAddr).AddrPort()

	t.Run("kpr dump --conntrack lists the flow", func(t *testing.T) {
		bin, err := kprproc.Binary()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "dump", "--conntrack", "-o", "json", "--bpf-root", kpr.BPFRoot).Output()
		if err != nil {
			t.Fatalf("kpr dump --conntrack: %v", err)
		}
		var flows []struct{ Protocol, Client, Frontend, Backend, State string }
		if err := json.Unmarshal(out, &flows); err != nil {
			t.Fatalf("parse kpr dump --conntrack -o json: %v\n%s", err, out)
		}
		found := slices.ContainsFunc(flows, func(f struct{ Protocol, Client, Frontend, Backend, State string }) bool {
			return f.Protocol == "TCP" && f.Client == netip.AddrPortFrom(client.Addr().Unmap(), client.Port()).String() &&
				f.Frontend == onNode.String() && f.State == "established" && strings.HasPrefix(f.Backend, "10.244.0.")
		})
		if !found {
			t.Errorf("kpr dump --conntrack lists no established TCP flow from %s to %s via a pod: %s", client, onNode, out)
		}
		table, err := exec.Command(bin, "dump", "--conntrack", "--bpf-root", kpr.BPFRoot).Output()
		if err != nil || !strings.Contains(string(table), onNode.String()) {
			t.Errorf("kpr dump --conntrack (table): %v\n%s", err, table)
		}
	})

	t.Run("metrics show conntrack entries and a drop reason", func(t *testing.T) {
		// A NodePort without endpoints drops traffic from outside.
		empty := kubeobj.Service(ns, "empty", kubeobj.Port{Name: "tcp", Port: 80, TargetPort: echoPort})
		empty.Spec.Type = v1.ServiceTypeNodePort
		if empty, err = api.CreateService(ctx, empty); err != nil {
			t.Fatal(err)
		}
		dropped := netip.AddrPortFrom(nodeAddrs[0].Addr(), uint16(empty.Spec.Ports[0].NodePort))
		metric := func(series string) float64 {
			v, err := kpr.Metric(series)
			if err != nil {
				return -1
			}
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
		if !eventually(30*time.Second, func() bool {
			if c, err := harness.DialTCP(top.client.NetNS, dropped, 200*time.Millisecond); err == nil {
				c.Close()
			}
			return metric(`kpr_tc_drops_total{reason="no_backend"}`) >= 1
		}) {
			t.Errorf("kpr_tc_drops_total{reason=\"no_backend\"} = %v after connecting to %s, want at least 1", metric(`kpr_tc_drops_total{reason="no_backend"}`), dropped)
		}
		// The count is cached for 10s.
		// An established flow that has carried a packet a second after
		// its handshake is in kpr_conntrack (bpf/ct.h, "Two maps").
		time.Sleep(time.Until(dialed.Add(1200 * time.Millisecond)))
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			t.Fatalf("write on the open flow: %v", err)
		}
		established := `kpr_tc_conntrack_entries{map="kpr_conntrack"}`
		if !eventually(15*time.Second, func() bool { return metric(established) >= 2 }) {
			t.Errorf("%s = %v with a flow open, want at least 2 (both directions)", established, metric(established))
		}
		for _, m := range []string{"kpr_conntrack", "kpr_ct_new"} {
			series := `kpr_tc_conntrack_max_entries{map="` + m + `"}`
			if got := metric(series); got <= 0 {
				t.Errorf("%s = %v, want the map's capacity", series, got)
			}
		}
	})
}

// answersWithin waits until fe answers a TCP echo from ns.
func answersWithin(ns *harness.NetNS, fe netip.AddrPort, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		_, err := harness.WhoTCP(ns, fe, 300*time.Millisecond)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eventually polls cond until it holds or d has passed.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	return true
}
