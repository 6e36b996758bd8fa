package nodeaddrs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Follower reads the node's devices, addresses and routes through netlink
// and reports each change of the State they select.
type Follower struct {
	ns    netns.NsHandle
	h     *netlink.Handle
	named []string
	log   *zap.Logger
	// settle is how long a burst of netlink events is let run before
	// the state is read again (an address change brings several).
	settle time.Duration
	// resync reads the state even without events: the kernel drops
	// multicast messages a slow reader misses (ENOBUFS), and a failed
	// apply is retried then.
	resync time.Duration

	// nodeIPs are the Node object's InternalIP and ExternalIP addresses
	// (SetNodeIPs); nodeIPsSet tells Run they changed.
	mu         sync.Mutex
	nodeIPs    []netip.Addr
	nodeIPsSet chan struct{}
}

// New follows the network namespace at netnsPath (a /proc/PID/ns/net file
// or a bind mount), or kpr's own when it is empty. Non-empty named are the
// devices the operator named (--devices). Close releases it.
func New(netnsPath string, named []string, log *zap.Logger) (*Follower, error) {
	if log == nil {
		log = zap.NewNop()
	}
	var ns netns.NsHandle
	var err error
	if netnsPath == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(netnsPath)
	}
	if err != nil {
		return nil, fmt.Errorf("open network namespace %q to follow its devices: %w", netnsPath, err)
	}
	// Routing netlink only: with no family named, the handle also opens
	// NETLINK_XFRM, which needs the xfrm_user module, and a node that
	// cannot load it on demand (no modprobe, modules_disabled) would
	// refuse kpr for a family it never uses.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("open netlink in network namespace %q: %w", netnsPath, err)
	}
	return &Follower{ns: ns, h: h, named: named, log: log, settle: 200 * time.Millisecond, resync: time.Minute,
		nodeIPsSet: make(chan struct{}, 1)}, nil
}

// Close releases the namespace and netlink handles.
func (f *Follower) Close() error {
	f.h.Close()
	return f.ns.Close()
}

// SetNodeIPs gives the Node object's InternalIP and ExternalIP addresses:
// a device that carries one is the node's, whatever its kind. Run reads
// the state again when they change. Safe from any goroutine; it does not
// block.
func (f *Follower) SetNodeIPs(ips []netip.Addr) {
	f.mu.Lock()
	changed := !slices.Equal(f.nodeIPs, ips)
	f.nodeIPs = slices.Clone(ips)
	f.mu.Unlock()
	if changed {
		select {
		case f.nodeIPsSet <- struct{}{}:
		default:
		}
	}
}

// Current reads the state now.
func (f *Follower) Current() (State, error) {
	links, err := f.links()
	if err != nil {
		return State{}, err
	}
	f.mu.Lock()
	nodeIPs := f.nodeIPs
	f.mu.Unlock()
	return Select(links, f.named, nodeIPs), nil
}

func (f *Follower) links() ([]Link, error) {
	nlLinks, err := f.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	addrs, err := f.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	byIndex := map[int][]Addr{}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		byIndex[a.LinkIndex] = append(byIndex[a.LinkIndex], Addr{IP: ip.Unmap(),
			Tentative: a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0})
	}
	defaults, err := f.defaultRouteLinks()
	if err != nil {
		return nil, err
	}
	out := make([]Link, 0, len(nlLinks))
	for _, l := range nlLinks {
		a := l.Attrs()
		out = append(out, Link{
			Name: a.Name, Index: a.Index, Kind: l.Type(),
			Up:           linkUp(a.Flags, a.OperState),
			Loopback:     a.Flags&net.FlagLoopback != 0,
			HasMaster:    a.MasterIndex != 0,
			DefaultRoute: defaults[a.Index],
			Headerless:   Headerless(a),
			Addrs:        byIndex[a.Index],
		})
	}
	return out, nil
}

// Headerless says the device's hardware type is not Ethernet, so its frames
// carry no Ethernet header (netlink names the type: "ether" for Ethernet,
// veth, bridge, bond, VLAN and the like; "none" for WireGuard and tun;
// "ipip", "gre", "sit", ... for IP tunnels). Loopback frames have one.
func Headerless(a *netlink.LinkAttrs) bool {
	return a.EncapType != "ether" && a.Flags&net.FlagLoopback == 0
}

// linkUp: administratively up, and not reported down. Devices without a
// carrier notion (dummy, tun) report "unknown", which is up.
func linkUp(flags net.Flags, oper netlink.LinkOperState) bool {
	if flags&net.FlagUp == 0 {
		return false
	}
	switch oper {
	case netlink.OperDown, netlink.OperLowerLayerDown, netlink.OperNotPresent:
		return false
	}
	return true
}

// defaultRouteLinks are the devices a default route of the main table
// leaves through, next hops of multipath routes included.
func (f *Follower) defaultRouteLinks() (map[int]bool, error) {
	out := map[int]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := f.h.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			out[r.LinkIndex] = true
			for _, hop := range r.MultiPath {
				out[hop.LinkIndex] = true
			}
		}
	}
	return out, nil
}

// Run calls apply with every new state until ctx is done; applied is the
// state already in place. An apply that fails is retried after a few
// seconds and at every change. Run returns nil when ctx ends.
func (f *Follower) Run(ctx context.Context, applied State, apply func(State) error) error {
	const retry = 2 * time.Second
	for ctx.Err() == nil {
		events, stop, errs, err := f.subscribe()
		if err != nil {
			f.log.Warn("cannot subscribe to netlink events; reading the devices and trying again in a moment", zap.Error(err))
			f.reconcile(&applied, apply)
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
			continue
		}
		// Read once subscribed: changes before it sent no event.
		timer := time.NewTimer(0)
		// armed: a read is due. A stream of events does not postpone it
		// past settle.
		armed := true
		arm := func(d time.Duration) {
			if !armed {
				timer.Reset(d)
				armed = true
			}
		}
		resync := time.NewTicker(f.resync)
		resubscribe := false
		for !resubscribe {
			select {
			case <-ctx.Done():
				resubscribe = true
			case <-events:
				arm(f.settle)
			case <-f.nodeIPsSet:
				arm(0)
			case err := <-errs:
				f.log.Warn("netlink subscription failed; subscribing again", zap.Error(err))
				resubscribe = true
			case <-resync.C:
				arm(0)
			case <-timer.C:
				armed = false
				if !f.reconcile(&applied, apply) {
					arm(retry)
				}
			}
		}
		timer.Stop()
		resync.Stop()
		stop()
		if ctx.Err() == nil {
			// A failing subscription is not retried in a tight loop.
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
		}
	}
	return nil
}

// HeaderlessWarning is logged with the devices the tc programs leave out
// for want of an Ethernet header.
const HeaderlessWarning = "devices without an Ethernet header get no tc programs, which read Ethernet frames: " +
	"NodePorts, ExternalIPs and LoadBalancer IPs are not served from outside through them"

// reconcile reads the state and applies it if it changed; false says the
// read or the apply failed.
func (f *Follower) reconcile(applied *State, apply func(State) error) bool {
	s, err := f.Current()
	if err != nil {
		f.log.Warn("cannot read the node's devices; retrying", zap.Error(err))
		return false
	}
	if s.Equal(*applied) {
		return true
	}
	if len(s.Headerless) > 0 && !slices.Equal(s.Headerless, applied.Headerless) {
		f.log.Warn(HeaderlessWarning, zap.Strings("devices", s.HeaderlessNames()))
	}
	if err := apply(s); err != nil {
		f.log.Error("cannot follow the node's devices and addresses; retrying", zap.Strings("devices", s.DeviceNames()),
			zap.Stringers("addresses", s.Addrs), zap.Error(err))
		return false
	}
	f.log.Info("node devices and addresses changed", zap.Strings("devices", s.DeviceNames()), zap.Stringers("addresses", s.Addrs),
		zap.Strings("previousDevices", applied.DeviceNames()), zap.Stringers("previousAddresses", applied.Addrs))
	*applied = s
	return true
}

// subscribe listens for link, address and route changes in the followed
// namespace. events gets one value per change, errs the subscriptions'
// failures; stop ends them.
func (f *Follower) subscribe() (events <-chan struct{}, stop func(), errs <-chan error, err error) {
	done := make(chan struct{})
	ev := make(chan struct{}, 1)
	errCh := make(chan error, 3)
	onErr := func(err error) {
		select {
		case errCh <- err:
		default:
		}
	}
	links := make(chan netlink.LinkUpdate, 64)
	addrs := make(chan netlink.AddrUpdate, 64)
	routes := make(chan netlink.RouteUpdate, 64)
	ns := f.ns
	stop = func() { close(done) }
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		close(done)
		return nil, func() {}, nil, fmt.Errorf("subscribe to link changes: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		close(done)
		return nil, func() {}, nil, fmt.Errorf("subscribe to address changes: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		close(done)
		return nil, func() {}, nil, fmt.Errorf("subscribe to route changes: %w", err)
	}
	// One goroutine per channel folds the updates into ev, and drains its
	// channel to the end, so that netlink's senders never block after
	// stop.
	notify := func() {
		select {
		case ev <- struct{}{}:
		default:
		}
	}
	go func() {
		for range links {
			notify()
		}
	}()
	go func() {
		for range addrs {
			notify()
		}
	}()
	go func() {
		for range routes {
			notify()
		}
	}()
	return ev, stop, errCh, nil
}
