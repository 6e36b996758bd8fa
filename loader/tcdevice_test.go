package loader

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func addr(t *testing.T, cidr string, scope int, flags int) netlink.Addr {
	t.Helper()
	ip, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		t.Fatal(err)
	}
	ipnet.IP = ip
	return netlink.Addr{IPNet: ipnet, Scope: scope, Flags: flags}
}

// The SNAT source of a device is its first usable address of each family:
// never a host-scoped, link-local, tentative or deprecated one.
func TestPickDeviceAddresses(t *testing.T) {
	got := pickDeviceAddresses([]netlink.Addr{
		addr(t, "127.0.0.1/8", unix.RT_SCOPE_HOST, 0),
		addr(t, "fe80::1/64", unix.RT_SCOPE_LINK, 0),
		addr(t, "2001:db8::9/64", unix.RT_SCOPE_UNIVERSE, unix.IFA_F_TENTATIVE),
		addr(t, "192.0.2.7/24", unix.RT_SCOPE_UNIVERSE, 0),
		addr(t, "192.0.2.8/24", unix.RT_SCOPE_UNIVERSE, 0),
		addr(t, "2001:db8::1/64", unix.RT_SCOPE_UNIVERSE, 0),
	})
	if want := netip.MustParseAddr("::ffff:192.0.2.7").As16(); got.Addr4 != want {
		t.Errorf("IPv4 source %v, want the primary 192.0.2.7 in the 16-byte form", netip.AddrFrom16(got.Addr4))
	}
	if want := netip.MustParseAddr("2001:db8::1").As16(); got.Addr6 != want {
		t.Errorf("IPv6 source %v, want 2001:db8::1", netip.AddrFrom16(got.Addr6))
	}
	if none := pickDeviceAddresses([]netlink.Addr{addr(t, "fe80::1/64", unix.RT_SCOPE_LINK, 0)}); none != (tcDevice{}) {
		t.Errorf("a device with only a link-local address has sources %+v, want none", none)
	}
}
