package loader

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/netnsexec"
)

// PodTC is the packet path for pods the socket hooks leave alone
// (bpf/tc_pod.c): its programs go on those pods' host-side devices, which
// a follower names through SetDevices as the pods come and go. tchooks.go
// says how they are attached; their pins and filters are apart from the
// node's devices' (tc.go).
type PodTC struct {
	Ingress *ebpf.Program
	Egress  *ebpf.Program

	bpfRoot string
	netNS   string
	want    TCAttachMode
	log     *zap.Logger

	mu      sync.Mutex
	mode    TCAttachMode // as the first attachment found it
	devices []string
}

// Close releases this process's handles on the programs. Attachments stay.
func (p *PodTC) Close() error {
	return errors.Join(p.Ingress.Close(), p.Egress.Close())
}

// LoadPodTC loads the pods' programs against l's maps, with the flow
// settings of opts (which must match the node's devices' programs: they
// share the conntrack), in the namespace opts.NetNS with the attach mode
// opts.Mode. It attaches them nowhere: SetDevices does. l keeps the
// programs and closes them with its Close.
func (l *Loaded) LoadPodTC(opts TCOptions, log *zap.Logger) (*PodTC, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if l.PodTC != nil {
		return nil, errors.New("the pods' tc programs are already loaded")
	}
	spec, err := bpf.LoadTcPod()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	if err := configureFlows(spec, opts); err != nil {
		return nil, err
	}
	var objs struct {
		Ingress *ebpf.Program `ebpf:"kpr_pod_ingress"`
		Egress  *ebpf.Program `ebpf:"kpr_pod_egress"`
	}
	if err := loadAgainstShared(spec, l.sizes, l.shared, l.cache, &objs); err != nil {
		return nil, fmt.Errorf("load the pods' tc programs: %w", err)
	}
	p := &PodTC{Ingress: objs.Ingress, Egress: objs.Egress,
		bpfRoot: l.BPFRoot, netNS: opts.NetNS, want: opts.Mode, log: log}
	// What a previous kpr attached stays until the follower names the
	// devices: its pods keep their path across the restart.
	p.devices = podHooks.pinnedDevices(l.BPFRoot)
	l.PodTC = p
	return p, nil
}

// SetDevices attaches the programs to exactly devices (host-side pod
// devices, by name in the node's namespace): new ones get them, those no
// longer named lose them.
func (p *PodTC) SetDevices(devices []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	mode := p.want
	if p.mode != TCAttachAuto {
		mode = p.mode
	}
	attach := func() error {
		ifaces := make([]netlink.Link, 0, len(devices))
		for _, dev := range devices {
			iface, err := netlink.LinkByName(dev)
			if err != nil {
				return fmt.Errorf("find pod device %s to attach the pods' tc programs to: %w", dev, err)
			}
			ifaces = append(ifaces, iface)
		}
		used, err := podHooks.attach(p.bpfRoot, ifaces, mode, tcPrograms{p.Ingress, p.Egress}, p.log)
		if err != nil {
			return err
		}
		if len(devices) > 0 {
			p.mode = used
		}
		return podHooks.removeFiltersExcept(devices, p.log)
	}
	var err error
	if p.netNS != "" {
		err = netnsexec.InPath(p.netNS, attach)
	} else {
		err = attach()
	}
	if err == nil {
		p.devices = slices.Clone(devices)
	}
	return err
}

// Devices names the devices the programs are on now.
func (p *PodTC) Devices() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.devices)
}
