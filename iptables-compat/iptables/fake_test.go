package iptables

import (
	"fmt"
	"strings"
	"sync"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// failingRunner fails the n-th restore (of any family) from the last
// failAt call, counting restores only: they are the backend's writes.
type failingRunner struct {
	netfilter.Runner
	mu       sync.Mutex
	n, count int
	err      error
}

func (r *failingRunner) failAt(n int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n, r.count, r.err = n, 0, err
}

func (r *failingRunner) Run(name string, args []string, stdin []byte) ([]byte, error) {
	if strings.HasSuffix(name, "-restore") {
		r.mu.Lock()
		r.count++
		fail := r.n > 0 && r.count == r.n
		err := r.err
		r.mu.Unlock()
		if fail {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return r.Runner.Run(name, args, stdin)
}
