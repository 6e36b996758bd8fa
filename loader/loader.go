// Package loader puts kpr's BPF programs into the kernel: it mounts what is
// missing, loads the objects, pins the maps, and attaches the programs to a
// cgroup with pinned bpf_links, so the dataplane outlives the process.
//
// A second Load against the same pins adopts them: maps keep their contents
// and the new programs are swapped into the existing links in place, so no
// connect() ever runs without a program. A pinned map whose size or layout
// no longer matches is carried over into a new map (carry.go).
package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
)

// MapSizes sets the max_entries of kpr's maps. Zero keeps the default
// compiled into the object.
type MapSizes struct {
	Services uint32 // master and slot entries of every frontend
	Backends uint32
	RevNat   uint32 // one per frontend
	SockRev  uint32 // per-socket reverse entries (LRU)
	Affinity uint32 // session affinity entries (LRU)
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
	Sizes     MapSizes
	Log       *zap.Logger
}

// Loaded is a running dataplane: its maps, held open for the control plane.
type Loaded struct {
	Maps       *bpf.KprMaps
	BPFRoot    string
	CgroupRoot string
	Features   Report
	// SockTerm is the UDP socket-termination iterator (kpr_sock_term_udp),
	// which reads Maps.KprSockTerm. Nil where the kernel cannot run it
	// (Features lacks FeatureUDPSockTerm). It is not pinned: only this
	// process runs it.
	SockTerm *ebpf.Program
}

// Close releases this process's handles. Pinned maps and links stay, and
// keep translating.
func (l *Loaded) Close() error {
	var err error
	if l.SockTerm != nil {
		err = l.SockTerm.Close()
	}
	return errors.Join(err, l.Maps.Close())
}

// attachment is one program and the cgroup hook it belongs on.
type attachment struct {
	program string
	attach  ebpf.AttachType
	// optional attachments are skipped, with a warning, when the kernel
	// lacks the hook.
	optional bool
}

var attachments = []attachment{
	{bpf.KprProgKprConnect4, ebpf.AttachCGroupInet4Connect, false},
	{bpf.KprProgKprConnect6, ebpf.AttachCGroupInet6Connect, false},
	{bpf.KprProgKprSendmsg4, ebpf.AttachCGroupUDP4Sendmsg, false},
	{bpf.KprProgKprSendmsg6, ebpf.AttachCGroupUDP6Sendmsg, false},
	{bpf.KprProgKprRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg, false},
	{bpf.KprProgKprRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg, false},
	{bpf.KprProgKprGetpeer4, ebpf.AttachCgroupInet4GetPeername, true},
	{bpf.KprProgKprGetpeer6, ebpf.AttachCgroupInet6GetPeername, true},
	{bpf.KprProgKprSockRelease, ebpf.AttachCgroupInetSockRelease, true},
}

// linkDir holds the pinned links under the BPF root.
func linkDir(bpfRoot string) string { return filepath.Join(bpfRoot, "links") }

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
	if err := spec.Variables[bpf.KprVarHaveSetRetval].Set(report.Has(FeatureSetRetval)); err != nil {
		return nil, fmt.Errorf("configure BPF object: %w", err)
	}
	hostCookie, err := hostNetNSCookie(opts.HostNetNS, log)
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[bpf.KprVarHostNetnsCookie].Set(hostCookie); err != nil {
		return nil, fmt.Errorf("configure BPF object: %w", err)
	}
	// The socket-termination iterator is optional: it is loaded on its own
	// below, so a kernel without it still gets every hook.
	termSpec := spec.Copy()
	delete(spec.Programs, bpf.KprProgKprSockTermUdp)

	// Pinned maps of another size or layout get new maps, filled with
	// their contents, which the new programs are loaded against; the pins
	// move over once the links run those programs.
	carry, err := prepareCarryOver(spec, opts.BPFRoot, log)
	if err != nil {
		return nil, err
	}
	defer carry.close()
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: opts.BPFRoot},
		MapReplacements: carry.replacements(),
	})
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("pinned maps under %s do not match the requested layout or sizes (%w); "+
			"run `kpr cleanup --bpf-root %s` to start empty",
			opts.BPFRoot, err, opts.BPFRoot)
	}
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("kernel verifier rejected kpr's programs: %+v", verr)
		}
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	// Links keep the programs alive; this process only keeps the maps,
	// which Assign takes out of the collection before it is closed.
	defer coll.Close()
	var kprMaps bpf.KprMaps
	if err := coll.Assign(&kprMaps); err != nil {
		return nil, fmt.Errorf("load BPF maps: %w", err)
	}

	for _, a := range attachments {
		if err := attachOrSwap(opts.BPFRoot, opts.CgroupRoot, a, coll.Programs[a.program], log); err != nil {
			if a.optional && errors.Is(err, ebpf.ErrNotSupported) {
				log.Warn("kernel lacks an optional hook; continuing without it",
					zap.String("program", a.program), zap.Error(err))
				continue
			}
			kprMaps.Close()
			return nil, err
		}
	}
	if err := carry.finish(log); err != nil {
		kprMaps.Close()
		return nil, err
	}
	loaded := &Loaded{Maps: &kprMaps, BPFRoot: opts.BPFRoot, CgroupRoot: opts.CgroupRoot, Features: report}
	if report.Has(FeatureUDPSockTerm) {
		loaded.SockTerm, err = loadSockTerm(termSpec, &kprMaps)
		if err != nil {
			loaded.Features.set(FeatureUDPSockTerm, err)
		}
	} else {
		err = errors.New(report.errorOf(FeatureUDPSockTerm))
	}
	if loaded.SockTerm == nil {
		log.Warn("kernel cannot destroy stale UDP sockets (needs iter/udp and bpf_sock_destroy, Linux 6.5+): "+
			"a connected UDP socket keeps sending to a removed backend until the application reconnects",
			zap.Error(err))
	}
	log.Info("dataplane loaded",
		zap.String("bpfRoot", opts.BPFRoot), zap.String("cgroupRoot", opts.CgroupRoot),
		zap.Bool("udpSocketTermination", loaded.SockTerm != nil))
	return loaded, nil
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

// loadSockTerm loads the socket-termination iterator against the loaded
// maps, so it sees the hooks' kpr_sock_rev and the control plane's targets.
func loadSockTerm(spec *ebpf.CollectionSpec, m *bpf.KprMaps) (*ebpf.Program, error) {
	var objs struct {
		Prog *ebpf.Program `ebpf:"kpr_sock_term_udp"`
	}
	err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		bpf.KprMapKprSockRev:  m.KprSockRev,
		bpf.KprMapKprSockTerm: m.KprSockTerm,
	}})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", bpf.KprProgKprSockTermUdp, err)
	}
	return objs.Prog, nil
}

func applySizes(spec *ebpf.CollectionSpec, s MapSizes) {
	set := func(name string, n uint32) {
		if n != 0 {
			spec.Maps[name].MaxEntries = n
		}
	}
	set(bpf.KprMapKprServices, s.Services)
	// One affinity match entry stands for one backend slot in the service
	// map, so it can never need more entries than that map has.
	set(bpf.KprMapKprAffinityMatch, s.Services)
	set(bpf.KprMapKprBackends, s.Backends)
	set(bpf.KprMapKprRevNat, s.RevNat)
	set(bpf.KprMapKprSockRev, s.SockRev)
	set(bpf.KprMapKprAffinity, s.Affinity)
}

// attachOrSwap keeps one pinned link per hook. An existing link on the same
// cgroup gets the new program swapped in atomically; a link on another
// cgroup (the operator changed --cgroup-root) is replaced.
func attachOrSwap(bpfRoot, cgroupRoot string, a attachment, prog *ebpf.Program, log *zap.Logger) error {
	pin := filepath.Join(linkDir(bpfRoot), a.program)
	wantID, err := cgroupID(cgroupRoot)
	if err != nil {
		return err
	}
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer old.Close()
		if linkCgroupID(old) == wantID {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("swap program %s into its pinned link: %w", a.program, err)
			}
			log.Debug("swapped program in place", zap.String("program", a.program))
			return nil
		}
		// The old link watches another cgroup: drop its pin so closing it
		// detaches the program there, then attach afresh below.
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin link %s: %w", pin, err)
		}
		log.Info("moving program to a new cgroup", zap.String("program", a.program), zap.String("cgroup", cgroupRoot))
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned link %s: %w (remove it with `kpr cleanup`)", pin, err)
	}

	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: a.attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach %s to cgroup %s: %w", a.program, cgroupRoot, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin link %s (kpr needs bpf_link support, Linux 5.7+, so that the dataplane outlives the process): %w", pin, err)
	}
	return nil
}

// cgroupID is the kernel's id for a cgroup v2 directory: its inode number.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}

func linkCgroupID(l link.Link) uint64 {
	info, err := l.Info()
	if err != nil || info.Cgroup() == nil {
		return 0
	}
	return info.Cgroup().CgroupId
}

// Cleanup detaches every kpr program and removes every pin under bpfRoot.
// It is safe to run when nothing is loaded.
func Cleanup(bpfRoot string) error {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	var errs []error
	links, _ := filepath.Glob(filepath.Join(linkDir(bpfRoot), "*"))
	for _, pin := range links {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("open pinned link %s: %w", pin, err))
			continue
		}
		// Unpinning and closing the last reference detaches the program.
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
		l.Close()
	}
	for _, name := range []string{bpf.KprMapKprServices, bpf.KprMapKprBackends, bpf.KprMapKprRevNat,
		bpf.KprMapKprSockRev, bpf.KprMapKprAffinity, bpf.KprMapKprAffinityMatch} {
		for _, pin := range []string{name, name + "_carry"} { // an interrupted carry-over (bpffs names cannot hold a dot)
			if err := os.Remove(filepath.Join(bpfRoot, pin)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove map pin: %w", err))
			}
		}
	}
	for _, dir := range []string{linkDir(bpfRoot), bpfRoot} {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// OpenPinnedMaps opens the maps of a running dataplane, for inspection and
// for a control plane that attaches nothing itself.
func OpenPinnedMaps(bpfRoot string) (*bpf.KprMaps, error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, name), nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s under %s: %w (is kpr running with --bpf-root %s?)", name, bpfRoot, err, bpfRoot)
		}
		return m, nil
	}
	var m bpf.KprMaps
	var err error
	for _, p := range []struct {
		name string
		dst  **ebpf.Map
	}{
		{bpf.KprMapKprServices, &m.KprServices},
		{bpf.KprMapKprBackends, &m.KprBackends},
		{bpf.KprMapKprRevNat, &m.KprRevNat},
		{bpf.KprMapKprSockRev, &m.KprSockRev},
		{bpf.KprMapKprAffinity, &m.KprAffinity},
		{bpf.KprMapKprAffinityMatch, &m.KprAffinityMatch},
	} {
		if *p.dst, err = open(p.name); err != nil {
			m.Close()
			return nil, err
		}
	}
	return &m, nil
}

// DetachCgroup force-detaches every kpr program linked to cgroupRoot, pinned
// or not, for example after the pins were lost. Programs of other tools on
// the same cgroup are left alone: only programs named kpr_* are touched.
func DetachCgroup(cgroupRoot string) (int, error) {
	want, err := cgroupID(cgroupRoot)
	if err != nil {
		return 0, err
	}
	detached := 0
	var errs []error
	var it link.Iterator
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Cgroup() == nil || info.Cgroup().CgroupId != want {
			continue
		}
		prog, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			continue
		}
		pinfo, err := prog.Info()
		prog.Close()
		if err != nil || !strings.HasPrefix(pinfo.Name, "kpr_") {
			continue
		}
		if err := it.Link.Detach(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s from %s: %w", pinfo.Name, cgroupRoot, err))
			continue
		}
		detached++
	}
	if err := it.Err(); err != nil {
		errs = append(errs, err)
	}
	return detached, errors.Join(errs...)
}
