package harness

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/tests/namedns"
)

// NamePrefix starts the name of every network namespace and cgroup the
// harness creates, so leftovers are easy to attribute.
const NamePrefix = "kpr-"

// NetNS is a named network namespace created by the harness. It is bind
// mounted at Path (/run/netns/<Name>), so `ip netns list` shows it and
// `nsenter --net=<Path>` enters it while the test runs.
type NetNS struct {
	// Name is the file name under /run/netns.
	Name string
	// Path is the bind mount that pins the namespace.
	Path string

	handle netns.NsHandle
	nl     *netlink.Handle
}

// Handle returns an open file descriptor of the namespace. It stays valid
// until the harness deletes the namespace at cleanup; do not close it.
func (ns *NetNS) Handle() netns.NsHandle { return ns.handle }

// Netlink returns a rtnetlink handle whose socket lives in the namespace, so
// link, address and route calls on it act inside the namespace whatever
// thread calls them. The harness owns it; do not close it.
func (ns *NetNS) Netlink() *netlink.Handle { return ns.nl }

// newNetNS creates and pins a named network namespace with lo up, through
// namedns, the project's one way to make them (it keeps the harness safe
// next to `ip netns add`). The calling thread is untouched.
func newNetNS(name string) (*NetNS, error) {
	h, err := namedns.Create(name)
	if err != nil {
		return nil, err
	}
	ns := &NetNS{Name: name, Path: namedns.Path(name), handle: h}
	// A netlink socket keeps the netns it was created in.
	err = Do(ns, func() (err error) {
		ns.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open netlink socket in netns %s: %w", name, err), ns.destroy())
	}
	if err := ns.setLinkUp("lo"); err != nil {
		return nil, errors.Join(err, ns.destroy())
	}
	return ns, nil
}

// destroy closes the harness's handles and deletes the pin. The kernel frees
// the namespace once nothing else references it (sockets and fds held by the
// test keep it alive until they are closed). It tolerates a half-created
// namespace and a repeated call; when the pin cannot be removed, the error
// says what holds it.
func (ns *NetNS) destroy() error {
	if ns.nl != nil {
		ns.nl.Close()
		ns.nl = nil
	}
	if ns.handle.IsOpen() {
		_ = ns.handle.Close()
	}
	return namedns.Delete(ns.Name)
}

func (ns *NetNS) setLinkUp(name string) error {
	l, err := ns.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find link %s in netns %s: %w", name, ns.Name, err)
	}
	if err := ns.nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("set link %s up in netns %s: %w", name, ns.Name, err)
	}
	return nil
}

// writeSysctl sets a per-namespace sysctl such as
// "net/ipv4/ip_forward". /proc/sys/net reflects the netns of the thread
// that opens it, so the write runs inside ns.
func (ns *NetNS) writeSysctl(key, value string) error {
	return Do(ns, func() error {
		p := filepath.Join("/proc/sys", key)
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("write sysctl %s=%s in netns %s: %w", key, value, ns.Name, err)
		}
		return nil
	})
}

// Do runs fn on an OS thread that is inside ns, and returns fn's error.
// Sockets created by fn stay in ns for their whole life, even when Go later
// uses them from other threads. Goroutines started by fn do NOT inherit the
// namespace, but processes forked by fn do (see StartCommand). The caller's
// thread is never switched, so Do is safe to call from any goroutine,
// concurrently.
func Do(ns *NetNS, fn func() error) error {
	if ns == nil || !ns.handle.IsOpen() {
		return errors.New("harness.Do: namespace is nil or already deleted")
	}
	return onFreshThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("get current netns: %w", err)
		}
		defer orig.Close()
		if err := netns.Set(ns.handle); err != nil {
			return fmt.Errorf("enter netns %s: %w", ns.Name, err)
		}
		fnErr := callCatchingPanic(fn)
		if err := netns.Set(orig); err != nil {
			return errThreadTainted{errors.Join(fnErr, fmt.Errorf("return from netns %s: %w", ns.Name, err))}
		}
		return fnErr
	})
}

// StartCommand starts cmd with its network namespace set to ns (the child
// is forked from a thread inside ns and inherits it), e.g. to run `kpr run`
// as the node's agent. Its mount namespace is the test's, so /sys/fs/bpf and
// cgroup2 stay visible (unlike under `ip netns exec`). The caller owns the
// process: stop it by cmd.Process and Wait for it.
func StartCommand(ns *NetNS, cmd *exec.Cmd) error {
	if err := Do(ns, cmd.Start); err != nil {
		return fmt.Errorf("start %s in %s: %w", cmd.Path, ns.Name, err)
	}
	return nil
}

// errThreadTainted marks a failure after which the locked thread is in an
// unknown namespace and must not be reused by the Go scheduler.
type errThreadTainted struct{ error }

func (e errThreadTainted) Unwrap() error { return e.error }

// panicError carries a panic from fn back to the caller's goroutine.
type panicError struct{ value any }

func (p panicError) Error() string { return fmt.Sprintf("panic: %v", p.value) }

func callCatchingPanic(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = panicError{v}
		}
	}()
	return fn()
}

// onFreshThread runs fn in a new goroutine locked to its OS thread. If fn
// reports that it could not restore the thread's namespace, the thread stays
// locked so the runtime destroys it when the goroutine exits instead of
// running other goroutines in the wrong namespace. Panics in fn are re-raised
// in the caller's goroutine.
func onFreshThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := callCatchingPanic(fn)
		var tainted errThreadTainted
		if !errors.As(err, &tainted) {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	err := <-errc
	var p panicError
	if errors.As(err, &p) {
		panic(p.value)
	}
	return err
}

// randomSuffix returns n random lowercase hex characters.
func randomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b)[:n]
}

// validName reports whether s is usable inside namespace and file names:
// 1 to 32 characters of [a-z0-9-], not starting with '-'.
func validName(s string) bool {
	if s == "" || len(s) > 32 || strings.HasPrefix(s, "-") {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}
