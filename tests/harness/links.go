package harness

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkUpTimeout bounds the wait for a new link to become usable; the
// kernel normally needs a few milliseconds, an emulated kernel-matrix VM
// on a busy machine far more.
const linkUpTimeout = 15 * time.Second

// waitFor polls cond until it holds, fails, or linkUpTimeout passes.
func waitFor(what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(linkUpTimeout)
	for {
		ok, err := cond()
		// A dump that raced with a change to the list it reads (addrconf
		// adding the very address waited for) is only a reason to look
		// again.
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s after %s", what, linkUpTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func operUp(nl *netlink.Handle, index int) func() (bool, error) {
	return func() (bool, error) {
		l, err := nl.LinkByIndex(index)
		if err != nil {
			return false, err
		}
		return l.Attrs().OperState == netlink.OperUp, nil
	}
}

func hasLinkLocal(nl *netlink.Handle, index int) func() (bool, error) {
	return func() (bool, error) {
		a, err := linkLocal(nl, index)
		return a.IsValid(), err
	}
}

// linkLocal is the link's usable (not tentative) IPv6 link-local address,
// or the zero Addr while it has none.
func linkLocal(nl *netlink.Handle, index int) (netip.Addr, error) {
	l, err := nl.LinkByIndex(index)
	if err != nil {
		return netip.Addr{}, err
	}
	addrs, err := nl.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
			ip, _ := netip.AddrFromSlice(a.IP)
			return ip, nil
		}
	}
	return netip.Addr{}, nil
}

// uplinkPeerName names the dead end of the uplink veth.
func uplinkPeerName(uplink string) string {
	if name := uplink + "-wire"; len(name) < unix.IFNAMSIZ {
		return name
	}
	return "uplink-wire"
}

// addAddr adds prefix to link and waits until it is usable. IPv6 addresses
// get IFA_F_NODAD so they do not stay tentative during duplicate detection.
func addAddr(nl *netlink.Handle, link netlink.Link, prefix netip.Prefix) error {
	a := &netlink.Addr{IPNet: prefixToIPNet(prefix)}
	if prefix.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := nl.AddrAdd(link, a); err != nil {
		return fmt.Errorf("add address %s to %s: %w", prefix, link.Attrs().Name, err)
	}
	// The kernel installs an IPv6 address's local route from a work queue,
	// even with NODAD; until then packets to it are routed away instead of
	// delivered. Return only once the address is really local.
	return waitFor(fmt.Sprintf("local route for %s on %s", prefix.Addr(), link.Attrs().Name), isLocal(nl, prefix.Addr()))
}

func isLocal(nl *netlink.Handle, addr netip.Addr) func() (bool, error) {
	return func() (bool, error) {
		routes, err := nl.RouteGet(addr.AsSlice())
		if err != nil {
			// No route at all yet (e.g. ENETUNREACH): keep waiting.
			return false, nil
		}
		return len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL, nil
	}
}

// prefixToIPNet keeps the host bits (net.IPNet{IP: addr, Mask: len}), which
// is what an interface address needs.
func prefixToIPNet(p netip.Prefix) *net.IPNet {
	addr := p.Addr().Unmap()
	return &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(p.Bits(), addr.BitLen())}
}
