package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/nodeaddrs"
)

// tcAttachNone is --tc-attach's value that leaves the tc programs out.
const tcAttachNone = "none"

// nodeDevices follows the node's devices and addresses for the tc
// programs: which devices they attach to (--devices, or those the
// nodeaddrs rule picks), and which local addresses serve NodePorts.
type nodeDevices struct {
	follower *nodeaddrs.Follower
	// initial is the state when kpr started: the devices Load attaches
	// to, and the addresses the first sync serves.
	initial nodeaddrs.State

	// headerless are the devices left out for want of an Ethernet
	// header, as last seen, for kpr status.
	mu         sync.Mutex
	headerless []string
}

// newNodeDevices reads the node's devices in --host-netns (kpr's own
// without it), where the tc programs attach. It returns nil when they are
// not wanted: another backend than eBPF, or --tc-attach none.
func newNodeDevices(f *runFlags, c choice, log *zap.Logger) (*nodeDevices, error) {
	if c.backend != backendEBPF || f.ebpf.tcAttach == tcAttachNone {
		return nil, nil
	}
	follower, err := nodeaddrs.New(f.hostNetNS, f.ebpf.devices, log)
	if err != nil {
		return nil, err
	}
	initial, err := follower.Current()
	if err != nil {
		follower.Close()
		return nil, fmt.Errorf("find the node's devices for the tc programs (or name them with --devices): %w", err)
	}
	if len(initial.Headerless) > 0 {
		log.Warn(nodeaddrs.HeaderlessWarning, zap.Strings("devices", initial.HeaderlessNames()))
	}
	if len(f.ebpf.devices) == 0 {
		log.Info("tc programs go to the devices that carry node addresses (--devices names others)",
			zap.Strings("devices", initial.DeviceNames()), zap.Stringers("addresses", initial.Addrs))
		// Load attaches to these.
		f.ebpf.detectedDevices = initial.DeviceNames()
	}
	return &nodeDevices{follower: follower, initial: initial, headerless: initial.HeaderlessNames()}, nil
}

// headerlessDevices are the devices the tc programs leave out for want of
// an Ethernet header; none for a nil n (no tc programs).
func (n *nodeDevices) headerlessDevices() []string {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.headerless
}

func (n *nodeDevices) close() error { return n.follower.Close() }

// follow keeps the tc programs on the node's devices and the NodePorts on
// its addresses until ctx ends: setDevices attaches, setAddrs hands the
// addresses to the translation.
func (n *nodeDevices) follow(ctx context.Context, setDevices func([]string) error, setAddrs func([]netip.Addr)) error {
	if len(n.initial.Devices) == 0 {
		// Load attached nowhere, so it left the links of a previous
		// kpr's devices in place.
		if err := setDevices(nil); err != nil {
			return err
		}
	}
	attached, addrs := n.initial.Devices, n.initial.Addrs
	return n.follower.Run(ctx, n.initial, func(s nodeaddrs.State) error {
		n.mu.Lock()
		n.headerless = s.HeaderlessNames()
		n.mu.Unlock()
		// Devices first: a NodePort on a new device's address is only
		// served once the programs are there. New addresses on the same
		// devices go to the programs too: they SNAT to them on kernels
		// whose FIB lookup cannot name a source (before 6.7).
		if !slices.Equal(s.Devices, attached) || !slices.Equal(s.Addrs, addrs) {
			if err := setDevices(s.DeviceNames()); err != nil {
				return err
			}
			attached, addrs = s.Devices, s.Addrs
		}
		setAddrs(s.Addrs)
		return nil
	})
}
