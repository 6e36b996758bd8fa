package main

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// teardown collects cleanup functions and runs them newest first, like
// testing.T does. It stands in for the testing.TB the harness package
// expects: the harness registers its namespace and cgroup removal with
// Cleanup and reports failures during them with Errorf, which is all it asks
// of a TB outside tests.
//
// The embedded testing.TB is nil: a harness call to any other method would
// panic, which is the loud failure we want if the harness starts needing
// more than this demo provides.
type teardown struct {
	testing.TB

	mu       sync.Mutex
	cleanups []func()
	errs     []error
}

// fatal is the panic value of Fatalf; run turns it back into an error.
type fatal struct{ err error }

func (t *teardown) Helper() {}

func (t *teardown) Cleanup(fn func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, fn)
}

func (t *teardown) Errorf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.errs = append(t.errs, fmt.Errorf(format, args...))
}

// Fatalf ends the current step: the panic unwinds to the demo's step runner,
// which reports the error and tears down.
func (t *teardown) Fatalf(format string, args ...any) {
	panic(fatal{fmt.Errorf(format, args...)})
}

func (t *teardown) Logf(string, ...any) {}

func (t *teardown) Name() string { return "kpr-demo" }

// run calls every registered cleanup, newest first, and returns the errors
// reported by them. Cleanups registered while it runs are run too. A
// panicking cleanup is reported and does not stop the others.
func (t *teardown) run() error {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			errs := t.errs
			t.errs = nil
			t.mu.Unlock()
			return errors.Join(errs...)
		}
		fn := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		t.callCatchingPanic(fn)
	}
}

func (t *teardown) callCatchingPanic(fn func()) {
	defer func() {
		if v := recover(); v != nil {
			if f, ok := v.(fatal); ok {
				t.Errorf("%v", f.err)
				return
			}
			t.Errorf("cleanup panicked: %v", v)
		}
	}()
	fn()
}
