package netfilter

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/netnsexec"
)

// ConntrackCleaner removes the conntrack entries that still send UDP from
// a frontend to anything but its current backends. UDP has no connection
// to end: an entry lives as long as datagrams keep coming, so a client
// that keeps one source port (a resolver) keeps reaching a gone endpoint,
// or keeps going out untranslated if its first datagram found no rule.
// Only a deleted entry lets the rules choose again (kube-proxy deletes
// these entries for the same reason).
type ConntrackCleaner interface {
	// DeleteStaleUDP deletes the UDP entries whose original destination
	// is a frontend of served and whose reply source is not one of that
	// frontend's backends, and returns how many.
	DeleteStaleUDP(served UDPFrontends) (int, error)
}

// NetlinkConntrack deletes entries through netlink in the calling
// thread's network namespace.
type NetlinkConntrack struct{}

func (NetlinkConntrack) DeleteStaleUDP(served UDPFrontends) (int, error) {
	byFamily := map[netlink.InetFamily]UDPFrontends{}
	for fe, backends := range served {
		fam := netlink.InetFamily(unix.AF_INET)
		if !fe.Addr().Is4() {
			fam = unix.AF_INET6
		}
		if byFamily[fam] == nil {
			byFamily[fam] = UDPFrontends{}
		}
		byFamily[fam][fe] = backends
	}
	total := 0
	var errs []error
	for fam, frontends := range byFamily {
		// One dump of the table per family serves every frontend.
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, staleUDPFilter(frontends))
		total += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("delete the stale conntrack entries of %d UDP frontends: %w", len(frontends), err))
		}
	}
	return total, errors.Join(errs...)
}

// ConntrackIn returns a ConntrackCleaner that deletes entries in the
// network namespace at netnsPath, the calling thread's if empty.
func ConntrackIn(netnsPath string) ConntrackCleaner {
	if netnsPath == "" {
		return NetlinkConntrack{}
	}
	return netnsConntrack{path: netnsPath}
}

type netnsConntrack struct{ path string }

func (c netnsConntrack) DeleteStaleUDP(served UDPFrontends) (n int, err error) {
	nsErr := netnsexec.InPath(c.path, func() error {
		n, err = NetlinkConntrack{}.DeleteStaleUDP(served)
		return nil
	})
	if nsErr != nil {
		return 0, nsErr
	}
	return n, err
}

// staleUDPFilter matches the entries of UDP flows sent to a frontend whose
// reply does not come from one of its backends: translated to a backend
// that left, or not translated at all (the reply source is then the
// frontend itself).
type staleUDPFilter UDPFrontends

func (f staleUDPFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok := addrPort(flow.Forward.DstIP, flow.Forward.DstPort)
	if !ok {
		return false
	}
	backends, served := f[dst]
	if !served {
		return false
	}
	src, ok := addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort)
	return ok && !backends[src]
}

func addrPort(ip net.IP, port uint16) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port), ok
}

// ConntrackTCPLiberal reports whether nf_conntrack_tcp_be_liberal is set
// in the calling thread's network namespace. There conntrack calls only
// out-of-window RSTs INVALID, so kube-proxy's drop of INVALID packets is
// left out, as kube-proxy leaves it out. A kernel without conntrack loaded
// has no such setting: false.
func ConntrackTCPLiberal() bool {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")
	return err == nil && strings.TrimSpace(string(b)) != "0"
}
