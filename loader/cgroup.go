package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
)

// The socket hooks of bpf/sock_lb.c, on a cgroup v2 directory, each behind
// a pinned bpf_link.

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

// attachCgroup attaches (or swaps in) every hook of coll on cgroupRoot.
func attachCgroup(bpfRoot, cgroupRoot string, coll *ebpf.Collection, log *zap.Logger) error {
	for _, a := range attachments {
		if err := attachOrSwap(bpfRoot, cgroupRoot, a, coll.Programs[a.program], log); err != nil {
			if a.optional && errors.Is(err, ebpf.ErrNotSupported) {
				log.Warn("kernel lacks an optional hook; continuing without it",
					zap.String("program", a.program), zap.Error(err))
				continue
			}
			return err
		}
	}
	return nil
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

// unpinLinks detaches every program pinned under bpfRoot's link directory:
// unpinning and closing the last reference detaches it.
func unpinLinks(bpfRoot string) (unpinned int, errs []error) {
	links, _ := filepath.Glob(filepath.Join(linkDir(bpfRoot), "*"))
	forward, reverse := splitReverseHooks(links)
	for i, pin := range slices.Concat(forward, reverse) {
		if i == len(forward) && len(forward) > 0 && len(reverse) > 0 {
			// A datagram the sendmsg hook translated just before it went
			// is answered by the backend's address; the recvmsg hook
			// must still be there to give the reply the Service's.
			time.Sleep(reverseHookGrace)
		}
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("open pinned link %s: %w", pin, err))
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		} else {
			unpinned++
		}
		l.Close()
	}
	return unpinned, errs
}

// reverseHookGrace is how long Cleanup keeps the hooks that translate
// replies back (recvmsg, getpeername, sock_release) after those that
// translate requests are gone: longer than a Service's answer to a
// request in flight takes.
const reverseHookGrace = 500 * time.Millisecond

// reverseHooks are the programs that undo a translation for a reply or a
// socket that one of the others translated.
var reverseHooks = []string{bpf.KprProgKprRecvmsg4, bpf.KprProgKprRecvmsg6, bpf.KprProgKprGetpeer4, bpf.KprProgKprGetpeer6, bpf.KprProgKprSockRelease}

// splitReverseHooks parts link pins into those of the reverse hooks and
// the rest (the request hooks and the tc links), each in pin order.
func splitReverseHooks(pins []string) (forward, reverse []string) {
	for _, pin := range pins {
		if slices.Contains(reverseHooks, filepath.Base(pin)) {
			reverse = append(reverse, pin)
		} else {
			forward = append(forward, pin)
		}
	}
	return forward, reverse
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
