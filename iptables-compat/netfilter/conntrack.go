package netfilter

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/netnsexec"
)

// ConntrackCleaner removes the conntrack entries that still send UDP from
// a frontend to a backend that left it. UDP has no connection to end: an
// entry lives as long as datagrams keep coming, so a client that keeps
// sending would keep reaching the gone endpoint (kube-proxy deletes these
// entries for the same reason).
type ConntrackCleaner interface {
	// DeleteUDP deletes the entries of the pairs and returns how many.
	DeleteUDP(removed []dataplane.RemovedBackend) (int, error)
}

// NetlinkConntrack deletes entries through netlink in the calling
// thread's network namespace.
type NetlinkConntrack struct{}

func (NetlinkConntrack) DeleteUDP(removed []dataplane.RemovedBackend) (int, error) {
	byFamily := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for _, rb := range removed {
		fam := netlink.InetFamily(unix.AF_INET)
		if !rb.Frontend.Addr().Unmap().Is4() {
			fam = unix.AF_INET6
		}
		byFamily[fam] = append(byFamily[fam], udpFlowFilter(rb))
	}
	total := 0
	var errs []error
	for fam, filters := range byFamily {
		// One dump of the table per family serves every pair.
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...)
		total += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("delete conntrack entries of %d removed UDP backends: %w", len(filters), err))
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

func (c netnsConntrack) DeleteUDP(removed []dataplane.RemovedBackend) (n int, err error) {
	nsErr := netnsexec.InPath(c.path, func() error {
		n, err = NetlinkConntrack{}.DeleteUDP(removed)
		return nil
	})
	if nsErr != nil {
		return 0, nsErr
	}
	return n, err
}

// udpFlowFilter matches the entries of UDP flows sent to the frontend and
// translated to the backend: the original direction's destination is the
// frontend, the reply comes from the backend.
type udpFlowFilter dataplane.RemovedBackend

func (f udpFlowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	return flow.Forward.Protocol == unix.IPPROTO_UDP &&
		sameAddr(flow.Forward.DstIP, f.Frontend.Addr()) && flow.Forward.DstPort == f.Frontend.Port() &&
		sameAddr(flow.Reverse.SrcIP, f.Backend.Addr()) && flow.Reverse.SrcPort == f.Backend.Port()
}

func sameAddr(ip net.IP, a netip.Addr) bool {
	got, ok := netip.AddrFromSlice(ip)
	return ok && got.Unmap() == a.Unmap()
}

// DeleteRemovedUDP deletes the conntrack entries of UDP flows to backends
// that left, once a sync no longer sends to them: the entries that still
// do are what would keep a client's flow on a dead backend. A failure is
// logged, never returned: the sync itself is right, and idle entries time
// out. The netfilter backends call it after a successful sync.
func DeleteRemovedUDP(c ConntrackCleaner, removed []dataplane.RemovedBackend, log *zap.Logger) {
	if len(removed) == 0 || c == nil {
		return
	}
	n, err := c.DeleteUDP(removed)
	if err != nil {
		log.Warn("Could not delete the conntrack entries of removed UDP backends", zap.Int("pairs", len(removed)), zap.Error(err))
		return
	}
	log.Debug("Deleted conntrack entries of removed UDP backends", zap.Int("pairs", len(removed)), zap.Int("entries", n))
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
