// Package sockterm destroys connected UDP sockets that kpr translated to a
// backend which has since left the Service, so that their owners see
// ECONNABORTED and reconnect to a live backend instead of sending to a dead
// pod forever. It is kpr's counterpart of kube-proxy deleting the conntrack
// entries of removed UDP endpoints.
//
// The work is done by kpr's iter/udp program (bpf/sock_term.c), which walks
// the UDP sockets of one network namespace: the one current when the
// iterator is opened. Client sockets live in many pod namespaces, so one
// run opens the iterator once in every network namespace that a process of
// kpr's cgroup is in, plus kpr's own.
package sockterm

import (
	"github.com/kpr-io/kpr/cgroupprocs"

	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/netnsexec"
)

// Terminator runs the socket-termination iterator. It is not safe for
// concurrent use: the sync loop is its only caller.
type Terminator struct {
	prog       *ebpf.Program
	targets    *maps.SockTermTargets
	cgroupRoot string
	procRoot   string
	log        *zap.Logger
}

// New returns a Terminator that runs prog (loader.Loaded.SockTerm) with
// targets (over the kpr_sock_term map) over the network namespaces of the
// processes under cgroupRoot.
func New(prog *ebpf.Program, targets *maps.SockTermTargets, cgroupRoot string, log *zap.Logger) *Terminator {
	if log == nil {
		log = zap.NewNop()
	}
	return &Terminator{prog: prog, targets: targets, cgroupRoot: cgroupRoot, procRoot: "/proc", log: log}
}

// Terminate destroys the connected UDP sockets that kpr translated from
// each removed backend's frontend to that backend, in every network
// namespace it can find, and returns how many it destroyed. One call makes
// one pass per namespace for all of removed (more only when removed does
// not fit the target map at once). A namespace that cannot be entered is
// skipped and reported in the error; the others are still done.
func (t *Terminator) Terminate(removed []dataplane.RemovedBackend) (int, error) {
	if len(removed) == 0 {
		return 0, nil
	}
	namespaces, err := t.namespaces()
	defer func() {
		for _, ns := range namespaces {
			ns.handle.Close()
		}
	}()
	errs := []error{err}
	iter, err := link.AttachIter(link.IterOptions{Program: t.prog})
	if err != nil {
		return 0, errors.Join(append(errs, fmt.Errorf("create UDP socket iterator: %w", err))...)
	}
	defer iter.Close()

	targets := make([]dataplane.RemovedBackend, 0, len(removed))
	seen := make(map[dataplane.RemovedBackend]struct{}, len(removed))
	for _, r := range removed {
		if _, dup := seen[r]; !dup {
			seen[r] = struct{}{}
			targets = append(targets, r)
		}
	}
	chunk := t.targets.Capacity()
	destroyed := 0
	for len(targets) > 0 {
		n := min(chunk, len(targets))
		batch := targets[:n]
		targets = targets[n:]
		if err := t.targets.Set(batch); err != nil {
			errs = append(errs, fmt.Errorf("write socket-termination targets: %w", err))
			break
		}
		d, err := runIn(namespaces, iter)
		destroyed += d
		errs = append(errs, err)
		if err := t.targets.Clear(batch); err != nil {
			errs = append(errs, fmt.Errorf("clear socket-termination targets: %w", err))
		}
	}
	return destroyed, errors.Join(errs...)
}

// namespace is one network namespace to walk, held open by handle.
type namespace struct {
	handle netns.NsHandle
	from   string // where it was found, for errors
}

// namespaces opens kpr's own network namespace and that of every process
// under the cgroup root, once each. A process that exits meanwhile is
// skipped silently.
func (t *Terminator) namespaces() ([]namespace, error) {
	type nsID struct{ dev, ino uint64 }
	seen := map[nsID]bool{}
	var out []namespace
	add := func(path string) error {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return err
		}
		id := nsID{st.Dev, st.Ino}
		if seen[id] {
			return nil
		}
		h, err := netns.GetFromPath(path)
		if err != nil {
			return err
		}
		seen[id] = true
		out = append(out, namespace{handle: h, from: path})
		return nil
	}
	if err := add(filepath.Join(t.procRoot, "self/ns/net")); err != nil {
		return out, fmt.Errorf("open own network namespace: %w", err)
	}
	pids, err := cgroupprocs.PIDs(t.cgroupRoot)
	for _, pid := range pids {
		// Errors are processes that exited since cgroup.procs was read,
		// or that this PID namespace cannot see.
		_ = add(filepath.Join(t.procRoot, strconv.Itoa(pid), "ns/net"))
	}
	return out, err
}

// runIn reads the iterator to its end once in each namespace and returns
// how many sockets it destroyed.
func runIn(namespaces []namespace, iter *link.Iter) (int, error) {
	destroyed := 0
	var errs []error
	for _, ns := range namespaces {
		d, err := runOne(ns, iter)
		destroyed += d
		errs = append(errs, err)
	}
	return destroyed, errors.Join(errs...)
}

// runOne opens the iterator inside ns (that fixes which namespace it
// walks) and reads it to its end outside: eight bytes, a socket cookie,
// per destroyed socket.
func runOne(ns namespace, iter *link.Iter) (int, error) {
	var rd io.ReadCloser
	err := netnsexec.In(int(ns.handle), func() (err error) {
		rd, err = iter.Open()
		return err
	})
	if err != nil {
		if rd != nil {
			rd.Close()
		}
		return 0, fmt.Errorf("open UDP socket iterator in network namespace of %s: %w", ns.from, err)
	}
	defer rd.Close()
	n, err := io.Copy(io.Discard, rd)
	if err != nil {
		return int(n / 8), fmt.Errorf("run UDP socket iterator in network namespace of %s: %w", ns.from, err)
	}
	return int(n / 8), nil
}
