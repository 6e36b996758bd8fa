// Package leftovers keeps the record of which mode wrote a node's network
// namespace, so that a kpr in another mode, or `kpr cleanup`, removes that
// mode's state and nothing else.
//
// The netfilter modes' state is in the node's tables, which other
// components write too (kubelet, the CNI plugin, maybe a kube-proxy that
// is being replaced). So a mode removes its state only where it recorded
// writing it: a directory beside the eBPF pins, named after the mode and
// the network namespace, created before the mode's first write. Like the
// tables it is gone after a reboot (bpffs is not persistent), and
// `kpr cleanup --bpf-root` finds it where it finds the pins. A kpr in a mode
// that never ran on a node touches none of that mode's state.
//
// Each backend records and removes its own state through a Record; this
// package holds only the mechanics, and knows no backend.
package leftovers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DefaultRoot is kpr's directory on the node unless --bpf-root names
// another: the eBPF mode's pins and every mode's records live under it. It
// is here, beside the records, rather than in the eBPF loader, because
// every mode needs it: a netfilter-mode kpr records its writes there and
// `kpr cleanup` finds them there without knowing which mode ran. It is on
// bpffs because the records must last exactly as long as what they name:
// until a reboot, like the tables and the pins.
const DefaultRoot = "/sys/fs/bpf/kpr"

// ErrNotRecorded says a mode left no record in a network namespace: it never
// wrote there, or its state was removed.
var ErrNotRecorded = errors.New("no record that this mode wrote the network namespace")

// Removed is what removing one mode's leftovers did, for the log and for
// `kpr cleanup`'s output.
type Removed struct {
	// Found says the mode had state to remove (its record was there);
	// false means there was nothing to do.
	Found bool
	// Count is how many of the mode's objects went: chains, virtual
	// servers; 0 where the mode does not count them.
	Count int
}

// Record is one mode's record of writing one network namespace.
type Record struct {
	mode, path string
}

// For is the record of mode for the network namespace at netnsPath (kpr's
// own if empty), kept beside bpfRoot.
func For(bpfRoot, netnsPath, mode string) (Record, error) {
	if bpfRoot == "" {
		return Record{}, errors.New("no bpffs directory (--bpf-root) to keep the record of kpr's " + mode + " mode beside")
	}
	if netnsPath == "" {
		netnsPath = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(netnsPath, &st); err != nil {
		return Record{}, fmt.Errorf("identify network namespace %s: %w", netnsPath, err)
	}
	// The namespace's inode number names it for as long as it lives;
	// bpffs refuses names with a dot.
	return Record{mode: mode, path: fmt.Sprintf("%s-%s-netns-%d", filepath.Clean(bpfRoot), mode, st.Ino)}, nil
}

// Path is where the record is kept.
func (r Record) Path() string { return r.path }

// Write records that the mode writes the namespace. The mode writes it
// before its first change, so that its state is removed later even if
// this process crashes.
func (r Record) Write() error {
	if err := os.MkdirAll(r.path, 0o700); err != nil {
		return fmt.Errorf("record that kpr's %s mode writes this node's network namespace (%w); "+
			"a kpr in another mode, and `kpr cleanup`, will not remove its state by itself", r.mode, err)
	}
	return nil
}

// Check returns nil if the record is there, an error wrapping
// ErrNotRecorded if it is not.
func (r Record) Check() error {
	_, err := os.Stat(r.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w (%s)", ErrNotRecorded, r.path)
	case err != nil:
		return fmt.Errorf("look for the record %s of kpr's %s mode: %w", r.path, r.mode, err)
	}
	return nil
}

// Remove runs remove, which deletes what, if the record is there, and then
// removes the record; on failure the record stays, so that the next
// cleanup tries again. remove returns how many objects it deleted.
func (r Record) Remove(what string, remove func() (int, error)) (Removed, error) {
	if err := r.Check(); errors.Is(err, ErrNotRecorded) {
		return Removed{}, nil
	} else if err != nil {
		return Removed{}, err
	}
	n, err := remove()
	if err != nil {
		return Removed{Found: true, Count: n}, fmt.Errorf("remove %s: %w (the record %s stays, so the next cleanup tries again)", what, err, r.path)
	}
	if err := os.Remove(r.path); err != nil {
		return Removed{Found: true, Count: n}, fmt.Errorf("remove %s: %w", r.path, err)
	}
	return Removed{Found: true, Count: n}, nil
}

// Write records, beside bpfRoot, that mode writes the network namespace at
// netnsPath (kpr's own if empty): For, then Record.Write.
func Write(bpfRoot, netnsPath, mode string) error {
	r, err := For(bpfRoot, netnsPath, mode)
	if err != nil {
		return err
	}
	return r.Write()
}

// Check returns nil if mode recorded writing the network namespace at
// netnsPath, an error wrapping ErrNotRecorded if it did not.
func Check(bpfRoot, netnsPath, mode string) error {
	r, err := For(bpfRoot, netnsPath, mode)
	if err != nil {
		return err
	}
	return r.Check()
}

// Remove runs remove, which deletes what, if mode recorded writing the
// network namespace at netnsPath, and then the record (Record.Remove).
func Remove(bpfRoot, netnsPath, mode, what string, remove func() (int, error)) (Removed, error) {
	r, err := For(bpfRoot, netnsPath, mode)
	if err != nil {
		return Removed{}, err
	}
	return r.Remove(what, remove)
}
