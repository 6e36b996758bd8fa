// Package netnsexec runs a function inside another network namespace.
//
// A network namespace belongs to an OS thread, not to a process or a
// goroutine, and the Go runtime moves goroutines between threads freely.
// So the function runs on a goroutine locked to a thread of its own, and
// the caller's thread never changes namespace. If the thread cannot return
// to its own namespace afterwards it stays locked, and the runtime ends it
// with the goroutine instead of handing a thread in the wrong namespace to
// other code.
package netnsexec

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// In runs fn inside the network namespace ns, an open file descriptor of a
// namespace file (/proc/PID/ns/net or a bind mount of one), and returns
// fn's error. The caller keeps ownership of ns.
func In(ns int, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err, returned := inOnThisThread(ns, fn)
		if returned {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// InPath is In for the namespace file at path.
func InPath(path string, fn func() error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer f.Close()
	return In(int(f.Fd()), fn)
}

// inOnThisThread enters ns, runs fn and goes back. returned is false when
// the thread may still be in ns.
func inOnThisThread(ns int, fn func() error) (err error, returned bool) {
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open this thread's network namespace: %w", err), true
	}
	defer unix.Close(orig)
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace: %w", err), true
	}
	fnErr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		return errors.Join(fnErr, fmt.Errorf("return to the thread's own network namespace: %w", err)), false
	}
	return fnErr, true
}
