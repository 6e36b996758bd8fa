package tcnat

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/nodeaddrs"
	"github.com/kpr-io/kpr/tests/harness"
)

// openTun creates the tun device name in ns and keeps it open until the
// test ends: a tun nobody reads has no carrier, and would be left out as
// down rather than for its missing Ethernet header.
func openTun(t *testing.T, ns *harness.NetNS, name string) netlink.Link {
	t.Helper()
	var f *os.File
	err := harness.Do(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		// The device is made in the namespace of the thread that asks.
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun")
		return nil
	})
	if err != nil {
		t.Skipf("cannot create a tun device here: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	link, err := ns.Netlink().LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return link
}

// A tun device (an L3 device without an Ethernet header, like WireGuard,
// ipip, gre and sit), up, with a node address and the default route, gets
// no tc programs: device detection leaves it out and lists it as
// headerless, and the loader refuses it when --devices names it, rather
// than run programs that would read its IP header as an Ethernet one.
func TestHeaderlessDeviceNotAttached(t *testing.T) {
	harness.RequireRoot(t)
	node, err := harness.NewNode(t, harness.Options{UplinkName: extDev})
	if err != nil {
		t.Fatal(err)
	}
	nl := node.NetNS.Netlink()
	tun := openTun(t, node.NetNS, "tun0")
	if err := nl.AddrAdd(tun, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.9"), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(tun); err != nil {
		t.Fatal(err)
	}
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: tun.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		t.Fatalf("default route through tun0: %v", err)
	}

	follower, err := nodeaddrs.New(node.NetNS.Path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	s, err := follower.Current()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(s.DeviceNames(), "tun0") {
		t.Errorf("device detection picked tun0, which has no Ethernet header: %+v", s)
	}
	if !slices.Contains(s.HeaderlessNames(), "tun0") {
		t.Errorf("tun0 is not listed as left out for want of an Ethernet header: %+v", s)
	}

	cg, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := loader.Load(loader.Options{BPFRoot: newBPFRoot(t), CgroupRoot: cg.Path, Sizes: fixtureSizes,
		TC: &loader.TCOptions{Devices: []string{"tun0"}, NetNS: node.NetNS.Path}})
	if err == nil {
		loaded.Close()
		t.Fatal("the loader attached the tc programs to tun0, which has no Ethernet header")
	}
	if !strings.Contains(err.Error(), "Ethernet") || !strings.Contains(err.Error(), "tun0") {
		t.Errorf("refusal names neither the device nor why: %v", err)
	}
	if st := deviceState(t, node.NetNS, "tun0"); !st.empty() {
		t.Errorf("tun0 carries tc programs after the refusal: %+v", st)
	}
}
