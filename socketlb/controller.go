package socketlb

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpr-io/kpr/maps"
)

// BypassMap is the socket hooks' list of bypassed network namespaces
// (maps.SockBypass).
type BypassMap interface {
	Set(netns uint64, reason maps.SockBypassReason) error
	Delete(netns uint64) error
	List() (map[uint64]maps.SockBypassReason, error)
}

// NamespaceFinder finds a pod's network on the node (PodNamespaces).
type NamespaceFinder interface {
	Find(uid types.UID) (PodNetwork, error)
}

// PacketPath is the bypassed pods' packet path (loader.PodTC): its
// programs sit on exactly the devices named last.
type PacketPath interface {
	SetDevices(devices []string) error
}

// Retry backoff for a pod whose namespace is not there yet: the first
// retries come fast, since a sidecar's first connection may follow the
// sandbox within a second; a pod that waits long for its image is asked
// rarely.
const (
	firstRetry = 100 * time.Millisecond
	maxRetry   = 5 * time.Second
)

// Controller keeps the bypassed pods off the socket hooks and on the
// packet path, in step with the pods of the node: the watch (Run) hands it
// every Pod of the node, and it decides each, finds the network of the
// bypassed ones, puts the packet path's programs on their devices and then
// lists their namespaces in kpr_sock_bypass. In that order, so that a pod
// is never left by both paths.
type Controller struct {
	rules  Rules
	finder NamespaceFinder
	bypass BypassMap
	path   PacketPath
	log    *zap.Logger

	mu       sync.Mutex
	pods     map[types.UID]*podState
	handlers map[string]string // RuntimeClass name → handler
	now      func() time.Time
	// onPath is the device set the packet path was given last.
	onPath []string
}

// podState is what the controller knows of one pod.
type podState struct {
	pod      *v1.Pod
	decision Decision
	// cookie is the pod's network namespace once found; 0 before.
	cookie uint64
	// devices are the node's ends of its veths once found, which the
	// packet path serves while the pod is bypassed.
	devices []string
	// written is the reason the map holds for cookie; 0 if none.
	written maps.SockBypassReason
	// retryAt and backoff pace the search for a bypassed pod's namespace.
	retryAt time.Time
	backoff time.Duration
	lastErr error
}

// NewController returns a controller writing to bypass and path. Under
// rules.HostOnly the socket hooks bypass every pod by themselves, and
// bypass may be nil.
func NewController(rules Rules, finder NamespaceFinder, bypass BypassMap, path PacketPath, log *zap.Logger) *Controller {
	return &Controller{rules: rules, finder: finder, bypass: bypass, path: path, log: log,
		pods: map[types.UID]*podState{}, handlers: map[string]string{}, now: time.Now}
}

// SetRuntimeClass records a RuntimeClass's handler ("" when it is deleted)
// and decides again for the pods that use it.
func (c *Controller) SetRuntimeClass(name, handler string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if handler == "" {
		delete(c.handlers, name)
	} else {
		c.handlers[name] = handler
	}
	for _, st := range c.pods {
		if RuntimeClassName(st.pod) == name {
			c.apply(st.pod)
		}
	}
}

// Update decides for a pod that was added or changed.
func (c *Controller) Update(pod *v1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.apply(pod)
}

// Delete forgets a pod and serves its namespace again.
func (c *Controller) Delete(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.pods[uid]
	if st == nil {
		return
	}
	delete(c.pods, uid)
	c.unwrite(st)
}

// apply decides for pod and writes the outcome; c.mu is held.
func (c *Controller) apply(pod *v1.Pod) {
	st := c.pods[pod.UID]
	if st == nil {
		st = &podState{}
		c.pods[pod.UID] = st
	}
	st.pod = pod
	d := c.rules.Decide(pod, c.handlers[RuntimeClassName(pod)])
	if d != st.decision {
		c.log.Info("socket LB decision", zap.String("pod", pod.Namespace+"/"+pod.Name),
			zap.Bool("bypass", d.Bypass), zap.Stringer("reason", d.Reason), zap.String("why", d.Why))
	}
	st.decision = d
	finished := pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
	if !d.Bypass || finished {
		c.unwrite(st)
		st.retryAt = time.Time{}
		return
	}
	// A change of the pod is worth a fresh look at once: its sandbox may
	// have started, or been recreated with a new namespace.
	st.backoff = 0
	c.resolve(st, true)
}

// resolve finds the network of a bypassed pod (again if fresh, or if not
// found yet), puts its devices on the packet path and writes its entry;
// c.mu is held.
func (c *Controller) resolve(st *podState, fresh bool) {
	if fresh || st.cookie == 0 {
		found, err := c.finder.Find(st.pod.UID)
		if err != nil {
			if st.cookie == 0 {
				c.later(st, err)
			}
			// Else keep the network found before: a pod's
			// processes may come and go.
			return
		}
		if found.Cookie != st.cookie || !slices.Equal(found.Devices, st.devices) {
			c.unwrite(st)
			st.cookie, st.devices = found.Cookie, found.Devices
			c.log.Debug("found a bypassed pod's network", zap.String("pod", st.pod.Namespace+"/"+st.pod.Name),
				zap.String("cgroup", found.Cgroup), zap.Uint64("netnsCookie", found.Cookie), zap.Strings("devices", found.Devices))
		}
	}
	if err := c.syncPath(); err != nil {
		c.later(st, err)
		return
	}
	if c.rules.HostOnly {
		// The hooks leave every pod alone: nothing to list.
		st.retryAt, st.lastErr = time.Time{}, nil
		return
	}
	reason := reasonInMap(st.decision.Reason)
	if st.written == reason {
		return
	}
	if err := c.bypass.Set(st.cookie, reason); err != nil {
		c.later(st, err)
		return
	}
	st.written, st.retryAt, st.lastErr = reason, time.Time{}, nil
}

// syncPath gives the packet path the devices of every bypassed pod whose
// network was found, if they changed; c.mu is held.
func (c *Controller) syncPath() error {
	want := c.pathDevices()
	if slices.Equal(want, c.onPath) {
		return nil
	}
	if err := c.path.SetDevices(want); err != nil {
		return fmt.Errorf("put the packet path's programs on the bypassed pods' devices: %w", err)
	}
	c.onPath = want
	return nil
}

// pathDevices are the devices of the bypassed pods, sorted; c.mu is held.
func (c *Controller) pathDevices() []string {
	devices := []string{}
	for _, st := range c.pods {
		if st.decision.Bypass && st.cookie != 0 {
			devices = append(devices, st.devices...)
		}
	}
	slices.Sort(devices)
	return slices.Compact(devices)
}

// later schedules another try for st after err.
func (c *Controller) later(st *podState, err error) {
	st.backoff = min(max(2*st.backoff, firstRetry), maxRetry)
	st.retryAt = c.now().Add(st.backoff)
	if !errors.Is(err, ErrNotYet) && (st.lastErr == nil || st.lastErr.Error() != err.Error()) {
		c.log.Warn("cannot bypass the socket hooks for a pod yet; its sockets are served by them until then",
			zap.String("pod", st.pod.Namespace+"/"+st.pod.Name), zap.Error(err))
	}
	st.lastErr = err
}

// unwrite serves st with the socket hooks again: its entry leaves the
// map, then its devices leave the packet path; c.mu is held.
func (c *Controller) unwrite(st *podState) {
	if st.written != 0 {
		if err := c.bypass.Delete(st.cookie); err != nil {
			c.log.Warn("cannot serve a pod with the socket hooks again", zap.String("pod", st.pod.Namespace+"/"+st.pod.Name), zap.Error(err))
			return
		}
		st.written = 0
	}
	if st.cookie == 0 {
		return
	}
	st.cookie, st.devices = 0, nil
	if err := c.syncPath(); err != nil {
		// The programs stay on the device, which serves nothing
		// the hooks do not: the pod's sockets reach backends.
		c.log.Warn("cannot take the packet path's programs off a pod's devices", zap.String("pod", st.pod.Namespace+"/"+st.pod.Name), zap.Error(err))
	}
}

// RetryDue tries again for every bypassed pod whose namespace was not
// found yet and whose time has come. It returns when the next one is due
// (zero if none is waiting).
func (c *Controller) RetryDue() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	var next time.Time
	for _, st := range c.pods {
		if st.retryAt.IsZero() {
			continue
		}
		if !st.retryAt.After(now) {
			c.resolve(st, false)
		}
		if !st.retryAt.IsZero() && (next.IsZero() || st.retryAt.Before(next)) {
			next = st.retryAt
		}
	}
	return next
}

// Prune removes the map's entries of namespaces no bypassed pod has, and
// the packet path's programs from devices no bypassed pod has: pods
// deleted while kpr was away. Run it once every pod the API lists has been
// applied.
func (c *Controller) Prune() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := c.pathDevices()
	if err := c.path.SetDevices(want); err != nil {
		return fmt.Errorf("take the packet path's programs off devices no bypassed pod has: %w", err)
	}
	c.onPath = want
	if c.rules.HostOnly {
		return nil
	}
	inMap, err := c.bypass.List()
	if err != nil {
		return err
	}
	keep := map[uint64]bool{}
	for _, st := range c.pods {
		if st.written != 0 {
			keep[st.cookie] = true
		}
	}
	var errs []error
	for cookie := range inMap {
		if !keep[cookie] {
			errs = append(errs, c.bypass.Delete(cookie))
		}
	}
	return errors.Join(errs...)
}

// PodStatus is one pod's socket-LB state, for `kpr status`.
type PodStatus struct {
	Pod    string `json:"pod"`
	Bypass bool   `json:"bypass"`
	Reason string `json:"reason"`
	Why    string `json:"why"`
	// NetNSCookie is the bypassed pod's network namespace, 0 until found.
	NetNSCookie uint64 `json:"netnsCookie,omitempty"`
	// Devices are the node's ends of its veths, which carry the packet
	// path's programs.
	Devices []string `json:"devices,omitempty"`
	// Waiting says why a bypassed pod is not in the map yet.
	Waiting string `json:"waiting,omitempty"`
}

// Status lists the bypassed pods, and those waiting to be, by name.
func (c *Controller) Status() []PodStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []PodStatus
	for _, st := range c.pods {
		if !st.decision.Bypass {
			continue
		}
		s := PodStatus{Pod: st.pod.Namespace + "/" + st.pod.Name, Bypass: true, Reason: st.decision.Reason.String(),
			Why: st.decision.Why, NetNSCookie: st.cookie, Devices: st.devices}
		if st.lastErr != nil {
			s.Waiting = st.lastErr.Error()
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out
}

func reasonInMap(r Reason) maps.SockBypassReason {
	switch r {
	case ByAnnotation:
		return maps.SockBypassAnnotation
	case ByMesh:
		return maps.SockBypassMesh
	case BySandbox:
		return maps.SockBypassSandbox
	default:
		panic(fmt.Sprintf("socketlb: no map reason for %v", r))
	}
}
