package loader

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/maps"
)

// MapSizes sets the max_entries of kpr's maps. Zero keeps the default
// compiled into the object.
type MapSizes struct {
	Services uint32 // master and slot entries of every frontend
	Backends uint32
	RevNat   uint32 // one per frontend
	SockRev  uint32 // per-socket reverse entries (LRU)
	Affinity uint32 // session affinity entries (LRU)
	// Conntrack entries of the tc programs (LRU), two per flow, for the
	// established flows that have lived on past a second.
	Conntrack uint32
	// ConntrackNew are the tc programs' conntrack entries (LRU) of flows
	// that are half-open, short or closing, which a SYN flood fills.
	ConntrackNew uint32
	// SrcRanges are loadBalancerSourceRanges entries, one per range of
	// each LoadBalancer IP.
	SrcRanges uint32
	// Frags are the tc programs' entries for fragmented datagrams in
	// flight (LRU), one per datagram between its first fragment and its
	// last.
	Frags uint32
}

// Options say where to pin and where to attach.
type Options struct {
	// BPFRoot is the directory on bpffs holding kpr's pins.
	BPFRoot string
	// CgroupRoot is the cgroup v2 directory whose sockets kpr translates.
	// Empty means the cgroup2 mount's root, i.e. every socket on the node.
	CgroupRoot string
	// HostNetNS is the node's own network namespace (a /proc/PID/ns/net
	// file or a bind mount of one); NodePorts on loopback are served only
	// to its sockets. Empty means OwnNetNS.
	HostNetNS string
	// SocketLB says which sockets the socket hooks serve; the zero value
	// serves all of them.
	SocketLB SocketLBMode
	Sizes    MapSizes
	// TC, when set, also loads the packet-level programs for traffic from
	// other machines and attaches them to TC.Devices (see LoadTC).
	TC *TCOptions
	// PodTC, when set, also loads the packet path for the pods the socket
	// hooks leave alone (see LoadPodTC), with these flow settings and
	// attach mode; its Devices are ignored.
	PodTC *TCOptions
	Log   *zap.Logger
}

// Loaded is a running dataplane: its maps, held open for the control plane.
type Loaded struct {
	Maps       *bpf.KprMaps
	BPFRoot    string
	CgroupRoot string
	Features   Report
	// SocketLB is the mode the socket hooks run: Options.SocketLB, or all
	// where the kernel cannot tell pods apart.
	SocketLB SocketLBMode
	// SockTerm is the UDP socket-termination iterator (kpr_sock_term_udp),
	// which destroys the sockets SockTermTargets lists. Both are nil where
	// the kernel cannot run it (Features lacks FeatureUDPSockTerm). Neither
	// is pinned: only this process runs the iterator.
	SockTerm        *ebpf.Program
	SockTermTargets *ebpf.Map
	// TC is the tc programs, once LoadTC (or Options.TC) loaded them.
	TC *TC
	// PodTC is the pods' packet path, once LoadPodTC (or Options.PodTC)
	// loaded it.
	PodTC *PodTC

	// What other objects are loaded with: the hooks' pinned maps (owned
	// by Maps), their sizes, and the decoded kernel BTF.
	shared map[string]*ebpf.Map
	sizes  MapSizes
	cache  *btf.Cache
}

// Close releases this process's handles. Pinned maps and links stay, and
// keep translating.
func (l *Loaded) Close() error {
	var errs []error
	if l.SockTerm != nil {
		errs = append(errs, l.SockTerm.Close(), l.SockTermTargets.Close())
	}
	if l.TC != nil {
		errs = append(errs, l.TC.Close())
	}
	if l.PodTC != nil {
		errs = append(errs, l.PodTC.Close())
	}
	return errors.Join(append(errs, l.Maps.Close())...)
}

// Load loads, pins and attaches kpr's programs, adopting existing pins.
func Load(opts Options) (*Loaded, error) {
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	if opts.BPFRoot == "" {
		opts.BPFRoot = DefaultBPFRoot
	}
	if err := EnsureBPFFS(opts.BPFRoot); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(linkDir(opts.BPFRoot), 0o700); err != nil {
		return nil, fmt.Errorf("create link pin directory: %w", err)
	}
	if opts.CgroupRoot == "" {
		root, err := EnsureCgroup2()
		if err != nil {
			return nil, err
		}
		opts.CgroupRoot = root
	}
	report := Probe()
	if err := report.RequireSocketLB(); err != nil {
		return nil, err
	}

	spec, err := bpf.LoadKpr()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	applySizes(spec, opts.Sizes)
	hostCookie, err := hostNetNSCookie(opts.HostNetNS, log)
	if err != nil {
		return nil, err
	}
	socketLB, err := effectiveSocketLB(opts.SocketLB, hostCookie, log)
	if err != nil {
		return nil, err
	}
	if err := configureHooks(spec, report, hostCookie, socketLB); err != nil {
		return nil, err
	}

	// Pinned maps of another size or layout get new maps, filled with
	// their contents, which the new programs are loaded against; the pins
	// move over once the links run those programs.
	carry, err := prepareCarryOver(spec, opts.BPFRoot, log)
	if err != nil {
		return nil, err
	}
	defer carry.close()
	// Both objects' programs resolve against the kernel's BTF: decode it
	// once.
	cache := btf.NewCache()
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: opts.BPFRoot},
		MapReplacements: carry.replacements(),
		Cache:           cache,
	})
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("pinned maps under %s do not match the requested layout or sizes (%w); "+
			"run `kpr cleanup --bpf-root %s` to start empty",
			opts.BPFRoot, err, opts.BPFRoot)
	}
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("kernel verifier rejected kpr's programs: %+w", verr)
		}
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	// Links keep the programs alive; this process only keeps the maps,
	// which Assign takes out of the collection before it is closed.
	defer coll.Close()
	// The maps every other object shares with the hooks, taken before
	// Assign empties the collection; kprMaps owns them.
	shared := map[string]*ebpf.Map{}
	for _, name := range pinnedIn(spec) {
		shared[name] = coll.Maps[name]
	}
	var kprMaps bpf.KprMaps
	if err := coll.Assign(&kprMaps); err != nil {
		return nil, fmt.Errorf("load BPF maps: %w", err)
	}

	if err := ensureNodeSeed(kprMaps.KprNodeSeed, log); err != nil {
		kprMaps.Close()
		return nil, err
	}
	if err := attachCgroup(opts.BPFRoot, opts.CgroupRoot, coll, log); err != nil {
		kprMaps.Close()
		return nil, err
	}
	if err := carry.finish(log); err != nil {
		kprMaps.Close()
		return nil, err
	}
	loaded := &Loaded{Maps: &kprMaps, BPFRoot: opts.BPFRoot, CgroupRoot: opts.CgroupRoot, Features: report, SocketLB: socketLB,
		shared: shared, sizes: opts.Sizes, cache: cache}
	// The socket-termination iterator is optional: a kernel without it
	// still gets every hook.
	if report.Has(FeatureUDPSockTerm) {
		var st sockTerm
		st, err = loadSockTerm(opts.Sizes, shared, cache)
		if err != nil {
			loaded.Features.set(FeatureUDPSockTerm, err)
		}
		loaded.SockTerm, loaded.SockTermTargets = st.prog, st.targets
	} else {
		err = errors.New(report.errorOf(FeatureUDPSockTerm))
	}
	if loaded.SockTerm == nil {
		log.Warn("kernel cannot destroy stale UDP sockets (needs iter/udp and bpf_sock_destroy, Linux 6.5+): "+
			"a connected UDP socket keeps sending to a removed backend until the application reconnects",
			zap.Error(err))
	}
	if opts.TC != nil {
		if _, err := loaded.LoadTC(*opts.TC, log); err != nil {
			loaded.Close()
			return nil, err
		}
	} else if err := nodeHooks.detachTCX(opts.BPFRoot, log); err != nil {
		loaded.Close()
		return nil, err
	}
	// The pods' packet path serves the pods the hooks leave alone: none
	// where the hooks serve every socket (as per-pod falls back to on a
	// kernel that cannot tell pods apart).
	if opts.PodTC != nil && socketLB != SocketLBAll {
		if _, err := loaded.LoadPodTC(*opts.PodTC, log); err != nil {
			loaded.Close()
			return nil, err
		}
	} else if err := podHooks.detachTCX(opts.BPFRoot, log); err != nil {
		loaded.Close()
		return nil, err
	}
	log.Info("dataplane loaded",
		zap.String("bpfRoot", opts.BPFRoot), zap.String("cgroupRoot", opts.CgroupRoot),
		zap.Stringer("socketLB", socketLB), zap.Bool("udpSocketTermination", loaded.SockTerm != nil))
	return loaded, nil
}

// configureHooks sets the socket hooks' constants: what the kernel offers
// (report), the host namespace's cookie and which sockets they serve. The
// verifier prunes the code the constants rule out, so they must be set
// before the programs load.
func configureHooks(spec *ebpf.CollectionSpec, report Report, hostCookie uint64, socketLB SocketLBMode) error {
	for name, v := range map[string]any{
		bpf.KprVarHaveSetRetval:   report.Has(FeatureSetRetval),
		bpf.KprVarHaveTaskHelpers: report.Has(FeatureTaskHelpers),
		bpf.KprVarHostNetnsCookie: hostCookie,
		bpf.KprVarSockLbMode:      socketLB.hookConstant(),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("configure BPF object: %s: %w", name, err)
		}
	}
	return nil
}

// hostNetNSCookie is the cookie the programs compare a socket's namespace
// with before treating a loopback address as a NodePort. Without it (a
// kernel before 5.14) kpr still runs, and loopback NodePorts are served to
// no socket: that is safe, since otherwise every pod would lose those ports
// of its own loopback. A namespace the operator named but that cannot be
// opened is an error.
func hostNetNSCookie(path string, log *zap.Logger) (uint64, error) {
	explicit := path != ""
	if !explicit {
		path = OwnNetNS
	}
	cookie, err := NetNSCookie(path)
	switch {
	case err == nil:
		return cookie, nil
	case errors.Is(err, unix.ENOPROTOOPT) || !explicit:
		log.Warn("cannot identify the host network namespace; NodePorts on 127.0.0.1 and ::1 are not served",
			zap.String("netns", path), zap.Error(err))
		return 0, nil
	}
	return 0, fmt.Errorf("host network namespace: %w", err)
}

// SizeMaps sets the requested sizes on spec's maps as Load does, for
// tests and tools that create kpr's maps themselves.
func SizeMaps(spec *ebpf.CollectionSpec, s MapSizes) { applySizes(spec, s) }

// applySizes sets the requested sizes on spec's copy of the shared maps.
// Every object is sized the same, so that each accepts the maps the hooks
// were loaded with.
func applySizes(spec *ebpf.CollectionSpec, s MapSizes) {
	set := func(name string, n uint32) {
		if ms := spec.Maps[name]; ms != nil && n != 0 {
			ms.MaxEntries = n
		}
	}
	set(bpf.KprMapKprServices, s.Services)
	// One affinity match entry stands for one backend slot in the service
	// map, so it can never need more entries than that map has.
	set(bpf.KprMapKprAffinityMatch, s.Services)
	set(bpf.KprMapKprBackends, s.Backends)
	set(bpf.KprMapKprRevNat, s.RevNat)
	// Every entry of kpr_maglev is keyed by a reverse-NAT id the LB
	// holds, and a scope: sized from kpr_rev_nat, it has room for the
	// tables of every frontend kpr_rev_nat admits, so a Service is
	// refused there (MapFull, naming --map-size-revnat) before any
	// frontend could lack room for its table. Only the outer map is
	// sized; its InnerMap, the arrays' template, stays as compiled.
	if rev := spec.Maps[bpf.KprMapKprRevNat]; rev != nil {
		set(bpf.KprMapKprMaglev, maps.MaglevMaxEntries(rev.MaxEntries))
	}
	set(bpf.KprMapKprSockRev, s.SockRev)
	set(bpf.KprMapKprAffinity, s.Affinity)
	set(bpf.KprMapKprConntrack, s.Conntrack)
	set(bpf.KprMapKprCtNew, s.ConntrackNew)
	set(bpf.KprMapKprSrcRanges, s.SrcRanges)
	set(bpf.KprMapKprFrags, s.Frags)
	roundPerCPULRUs(spec)
}

// roundPerCPULRUs rounds the size of every LRU map with one list per CPU
// (BPF_F_NO_COMMON_LRU, kpr_ct_new) up to a multiple of the possible CPUs,
// as the kernel does when it creates one: the spec then says what the
// kernel reports, and a pinned map of the same request is adopted on the
// next start rather than carried over into a new one.
func roundPerCPULRUs(spec *ebpf.CollectionSpec) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil || cpus < 1 {
		return // the kernel rounds; the next start carries the map over
	}
	for _, ms := range spec.Maps {
		if ms.Type == ebpf.LRUHash && ms.Flags&unix.BPF_F_NO_COMMON_LRU != 0 && ms.MaxEntries%uint32(cpus) != 0 {
			ms.MaxEntries += uint32(cpus) - ms.MaxEntries%uint32(cpus)
		}
	}
}
