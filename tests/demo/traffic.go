package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// requestTimeout bounds one GET. Pods are on the same bridge, so anything
// slower than this is a failure worth reporting, not waiting for.
const requestTimeout = 3 * time.Second

// tally counts which pod answered how many requests.
type tally map[string]int

func (t tally) total() int {
	n := 0
	for _, c := range t {
		n += c
	}
	return n
}

// String lists the pods in name order, e.g. "web-1 4, web-2 5, web-3 3".
func (t tally) String() string {
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	slices.Sort(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %d", name, t[name]))
	}
	return strings.Join(parts, ", ")
}

// client sends GETs to a Service from the node namespace. Its sockets are
// created by this process, which sits in the demo cgroup, so kpr's connect
// hook picks a backend for each one; without kpr the ClusterIP would be
// unreachable (the node namespace has no route to it).
type client struct {
	ns     *harness.NetNS
	target netip.AddrPort
}

// who sends one GET and returns the pod named in the answer.
func (c client) who() (string, error) {
	body, err := harness.HTTPGet(c.ns, c.target, "/", requestTimeout)
	if err != nil {
		return "", err
	}
	name, ok := strings.CutPrefix(strings.TrimSpace(body), "hello from ")
	if !ok {
		return "", fmt.Errorf("GET http://%s/: unexpected answer %q (want \"hello from <pod>\")", c.target, body)
	}
	return name, nil
}

// sample sends n GETs, then keeps going (up to maxRequests in all) until
// every pod in mustAnswer has answered at least once: backends are picked at
// random, so a fixed small n would now and then miss one by chance.
func (c client) sample(ctx context.Context, n int, mustAnswer []string) (tally, error) {
	const maxRequests = 120
	t := tally{}
	for {
		missing := slices.DeleteFunc(slices.Clone(mustAnswer), func(p string) bool { return t[p] > 0 })
		if t.total() >= n && len(missing) == 0 {
			return t, nil
		}
		if t.total() >= maxRequests {
			return t, fmt.Errorf("%s never answered in %d requests to %s (answers: %s)", strings.Join(missing, ", "), maxRequests, c.target, t)
		}
		if err := ctx.Err(); err != nil {
			return t, err
		}
		name, err := c.who()
		if err != nil {
			return t, err
		}
		t[name]++
	}
}

// mapWatcher reads kpr's pinned maps directly, to see the moment a change
// reaches the dataplane without the cost of running `kpr dump`.
type mapWatcher struct {
	pinned *bpf.KprMaps
}

func newMapWatcher(bpfRoot string) (*mapWatcher, error) {
	m, err := loader.OpenPinnedMaps(bpfRoot)
	if err != nil {
		return nil, err
	}
	return &mapWatcher{pinned: m}, nil
}

func (w *mapWatcher) Close() error { return w.pinned.Close() }

// backends returns the sorted backend addresses the maps hold for frontend,
// across all its scopes.
func (w *mapWatcher) backends(frontend netip.AddrPort) ([]netip.Addr, error) {
	lb, err := maps.OpenReadOnly(w.pinned)
	if err != nil {
		return nil, fmt.Errorf("read kpr's maps: %w", err)
	}
	var out []netip.Addr
	for _, svc := range lb.List() {
		if svc.Addr != frontend.Addr() || svc.Port != frontend.Port() {
			continue
		}
		for _, b := range svc.Backends {
			if !slices.Contains(out, b.Addr) {
				out = append(out, b.Addr)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// waitFor polls the maps until frontend's backends are exactly want, and
// returns how long that took from since.
func (w *mapWatcher) waitFor(ctx context.Context, frontend netip.AddrPort, want []netip.Addr, since time.Time) (time.Duration, error) {
	want = slices.Clone(want)
	slices.SortFunc(want, netip.Addr.Compare)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []netip.Addr
	for {
		var err error
		if got, err = w.backends(frontend); err != nil {
			return 0, err
		}
		if slices.Equal(got, want) {
			return time.Since(since), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("kpr's maps still hold backends %v for %s, want %v: %w", got, frontend, want, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
