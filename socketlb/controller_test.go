package socketlb

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	kprmaps "github.com/kpr-io/kpr/maps"
)

// fakeMap is kpr_sock_bypass in memory.
type fakeMap map[uint64]kprmaps.SockBypassReason

func (m fakeMap) Set(netns uint64, r kprmaps.SockBypassReason) error { m[netns] = r; return nil }
func (m fakeMap) Delete(netns uint64) error                          { delete(m, netns); return nil }
func (m fakeMap) List() (map[uint64]kprmaps.SockBypassReason, error) { return maps.Clone(m), nil }

// fakeNamespaces answers with the cookies it has, ErrNotYet otherwise.
type fakeNamespaces map[types.UID]uint64

func (f fakeNamespaces) Find(uid types.UID) (PodNetwork, error) {
	if c, ok := f[uid]; ok {
		return PodNetwork{Cookie: c, Cgroup: "/cg/pod" + string(uid), Devices: []string{vethOf(uid)}}, nil
	}
	return PodNetwork{}, fmt.Errorf("%w: no cgroup", ErrNotYet)
}

func vethOf(uid types.UID) string { return "veth-" + string(uid) }

// fakePath is the packet path: the devices it was given last, and what
// kpr_sock_bypass held at each call, which tells the order of the two.
type fakePath struct {
	devices []string
	calls   int
	fail    error
	m       fakeMap
	// mapAt holds, per call, the map's namespaces at that moment.
	mapAt []fakeMap
}

func (p *fakePath) SetDevices(devices []string) error {
	p.calls++
	p.mapAt = append(p.mapAt, maps.Clone(p.m))
	if p.fail != nil {
		return p.fail
	}
	p.devices = slices.Clone(devices)
	return nil
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestController(ns fakeNamespaces, m fakeMap) (*Controller, *clock) {
	c, clk, _ := newTestControllerWithPath(ns, m)
	return c, clk
}

func newTestControllerWithPath(ns fakeNamespaces, m fakeMap) (*Controller, *clock, *fakePath) {
	path := &fakePath{m: m}
	c := NewController(Rules{SandboxHandlers: DefaultSandboxHandlers}, ns, m, path, zap.NewNop())
	clk := &clock{t: time.Unix(1000, 0)}
	c.now = clk.now
	return c, clk, path
}

func meshPod(uid types.UID) *v1.Pod {
	p := podWith(map[string]string{istioSidecarStatus: "{}"}, nil, "")
	p.UID, p.Name = uid, "pod-"+string(uid)
	return p
}

func TestControllerWritesBypassedPodsAndRemovesThem(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11, "b": 12}, fakeMap{}
	c, _ := newTestController(ns, m)
	c.Update(meshPod("a"))
	plain := podWith(nil, nil, "")
	plain.UID = "b"
	c.Update(plain)
	if len(m) != 1 || m[11] != kprmaps.SockBypassMesh {
		t.Fatalf("map after a mesh pod and a plain one = %v, want only the mesh pod's namespace 11", m)
	}
	// The annotation that keeps it with the hooks removes its entry.
	served := meshPod("a")
	served.Annotations[Annotation] = AnnotationServe
	c.Update(served)
	if len(m) != 0 {
		t.Fatalf("map after the serve annotation = %v, want empty", m)
	}
	c.Update(meshPod("a"))
	c.Delete("a")
	if len(m) != 0 {
		t.Fatalf("map after the pod's deletion = %v, want empty", m)
	}
	// A pod that finished has no namespace to bypass.
	done := meshPod("a")
	done.Status.Phase = v1.PodSucceeded
	c.Update(done)
	if len(m) != 0 {
		t.Errorf("map with a finished pod = %v, want empty", m)
	}
}

func TestControllerRetriesAPodWhoseNamespaceIsNotThereYet(t *testing.T) {
	ns, m := fakeNamespaces{}, fakeMap{}
	c, clk := newTestController(ns, m)
	c.Update(meshPod("a"))
	next := c.RetryDue()
	if len(m) != 0 || next.Sub(clk.t) != firstRetry {
		t.Fatalf("before the sandbox: map %v, next retry in %v; want empty and %v", m, next.Sub(clk.t), firstRetry)
	}
	if st := c.Status(); len(st) != 1 || st[0].Waiting == "" {
		t.Errorf("status of a pod waiting for its namespace = %+v, want it listed as waiting", st)
	}
	// Backoff: each failed try waits longer, up to maxRetry.
	for range 10 {
		clk.t = next
		next = c.RetryDue()
	}
	if next.Sub(clk.t) != maxRetry {
		t.Errorf("after many tries the next comes in %v, want %v", next.Sub(clk.t), maxRetry)
	}
	ns["a"] = 21 // the sandbox started
	clk.t = next
	if next = c.RetryDue(); !next.IsZero() || m[21] != kprmaps.SockBypassMesh {
		t.Errorf("once the namespace exists: map %v, next retry %v; want namespace 21 and no retry", m, next)
	}
}

func TestControllerFollowsARecreatedSandbox(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11}, fakeMap{}
	c, _ := newTestController(ns, m)
	c.Update(meshPod("a"))
	ns["a"] = 31 // the sandbox was recreated: a new namespace
	c.Update(meshPod("a"))
	if len(m) != 1 || m[31] == 0 {
		t.Errorf("map after the sandbox's new namespace = %v, want only 31", m)
	}
}

func TestControllerDecidesAgainWhenARuntimeClassChanges(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11}, fakeMap{}
	c, _ := newTestController(ns, m)
	pod := podWith(nil, nil, "secure")
	pod.UID = "a"
	c.Update(pod)
	if len(m) != 0 {
		t.Fatalf("map with RuntimeClass secure unknown = %v, want empty", m)
	}
	c.SetRuntimeClass("secure", "kata-fc")
	if m[11] != kprmaps.SockBypassSandbox {
		t.Fatalf("map after RuntimeClass secure became kata = %v, want namespace 11 as sandbox", m)
	}
	c.SetRuntimeClass("secure", "")
	if len(m) != 0 {
		t.Errorf("map after RuntimeClass secure was deleted = %v, want empty", m)
	}
}

func TestPruneRemovesPodsGoneWhileAway(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11}, fakeMap{11: kprmaps.SockBypassMesh, 99: kprmaps.SockBypassMesh}
	c, _ := newTestController(ns, m)
	c.Update(meshPod("a"))
	if err := c.Prune(); err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[11] == 0 {
		t.Errorf("map after prune = %v, want only the live pod's 11", m)
	}
}

// A bypassed pod gets the packet path's programs before the socket hooks
// leave it, and keeps them until the hooks serve it again: it is never
// left by both.
func TestControllerPutsThePacketPathFirstAndTakesItLast(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11}, fakeMap{}
	c, _, path := newTestControllerWithPath(ns, m)
	c.Update(meshPod("a"))
	if !slices.Equal(path.devices, []string{"veth-a"}) || m[11] == 0 {
		t.Fatalf("after a mesh pod: path %v, map %v; want veth-a and namespace 11", path.devices, m)
	}
	if last := path.mapAt[len(path.mapAt)-1]; len(last) != 0 {
		t.Errorf("the packet path got veth-a when the map already held %v: the pod was on neither path for a moment", last)
	}
	calls := path.calls
	c.Delete("a")
	if len(path.devices) != 0 || len(m) != 0 || path.calls != calls+1 {
		t.Fatalf("after the pod's deletion: path %v, map %v", path.devices, m)
	}
	if at := path.mapAt[len(path.mapAt)-1]; len(at) != 0 {
		t.Errorf("veth-a left the packet path while the map still held %v", at)
	}
}

// A packet path that cannot take a pod's device keeps it with the socket
// hooks, and is tried again.
func TestControllerKeepsAPodWithTheHooksUntilThePathTakesIt(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11}, fakeMap{}
	c, clk, path := newTestControllerWithPath(ns, m)
	path.fail = errors.New("attach failed")
	c.Update(meshPod("a"))
	if len(m) != 0 {
		t.Fatalf("map after a failed attach = %v, want empty", m)
	}
	if st := c.Status(); len(st) != 1 || st[0].Waiting == "" {
		t.Errorf("status = %+v, want the pod waiting, with the attach's error", st)
	}
	path.fail = nil
	clk.t = c.RetryDue()
	c.RetryDue()
	if m[11] == 0 || !slices.Equal(path.devices, []string{"veth-a"}) {
		t.Errorf("after the retry: map %v, path %v; want the pod on the packet path and bypassed", m, path.devices)
	}
}

// Under host-only every pod is on the packet path, and the map, which the
// hooks do not read then, stays empty.
func TestHostOnlyPutsEveryPodOnThePacketPath(t *testing.T) {
	ns, m := fakeNamespaces{"a": 11, "b": 12}, fakeMap{}
	path := &fakePath{m: m}
	c := NewController(Rules{HostOnly: true}, ns, nil, path, zap.NewNop())
	plain := podWith(nil, nil, "")
	plain.UID, plain.Name = "b", "plain"
	c.Update(meshPod("a"))
	c.Update(plain)
	host := podWith(nil, nil, "")
	host.UID, host.Spec.HostNetwork = "c", true
	c.Update(host)
	if !slices.Equal(path.devices, []string{"veth-a", "veth-b"}) {
		t.Errorf("packet path under host-only = %v, want both pods' devices and not the host-network pod's", path.devices)
	}
	if err := c.Prune(); err != nil {
		t.Fatal(err)
	}
	if len(m) != 0 {
		t.Errorf("map under host-only = %v, want it untouched", m)
	}
}
