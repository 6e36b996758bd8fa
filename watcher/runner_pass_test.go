package watcher

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

// checkingDataplane is a recordingDataplane whose whole-state check is slow
// until the test says otherwise, the way reading 200,000 map entries is:
// as one blocking Reconcile call, or as many steps of a DriftCheck.
type checkingDataplane struct {
	*recordingDataplane
	// busy is signalled when a periodic check (a Reconcile after the
	// first, or a drift check step) is under way.
	busy chan struct{}

	mu sync.Mutex
	// slow makes Reconciles after the first block, and drift checks not
	// end, until release is closed.
	slow        bool
	release     chan struct{}
	releaseOnce sync.Once
	// drifted makes the next drift check report that the maps differ.
	drifted bool
	// steps counts the drift check steps taken.
	steps int
}

func newCheckingDataplane(h *harness) *checkingDataplane {
	d := &checkingDataplane{recordingDataplane: h.dp, busy: make(chan struct{}, 1), release: make(chan struct{})}
	h.runner.syncer.dp = d
	return d
}

// finish lets a slow check end.
func (d *checkingDataplane) finish() { d.releaseOnce.Do(func() { close(d.release) }) }

func (d *checkingDataplane) signalBusy() {
	select {
	case d.busy <- struct{}{}:
	default:
	}
}

func (d *checkingDataplane) setSlow() {
	d.mu.Lock()
	d.slow = true
	d.mu.Unlock()
}

func (d *checkingDataplane) isSlow() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.slow {
		return false
	}
	select {
	case <-d.release:
		return false
	default:
		return true
	}
}

func (d *checkingDataplane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	if d.isSlow() {
		d.signalBusy()
		<-d.release
	}
	return d.recordingDataplane.Reconcile(all)
}

func (d *checkingDataplane) StartDriftCheck() dataplane.DriftCheck {
	d.mu.Lock()
	drifted := d.drifted
	d.drifted = false
	d.mu.Unlock()
	return &slowCheck{d: d, drifted: drifted}
}

type slowCheck struct {
	d       *checkingDataplane
	drifted bool
}

func (c *slowCheck) Step() (done, held bool, err error) {
	c.d.mu.Lock()
	c.d.steps++
	c.d.mu.Unlock()
	if c.d.isSlow() {
		c.d.signalBusy()
		time.Sleep(time.Millisecond) // a step's worth of map reading
		return false, false, nil
	}
	return true, !c.drifted, nil
}

// An update that arrives while the periodic full reconcile runs is applied
// at once, not after the reconcile, however long the reconcile takes.
func TestUpdateDuringPeriodicFullReconcileIsNotHeldUp(t *testing.T) {
	h := newHarness(t, harnessOptions{syncPeriod: 100 * time.Millisecond})
	dp := newCheckingDataplane(h)
	h.putService("a", "10.96.0.1")
	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.1")
	h.start()
	t.Cleanup(dp.finish) // before the loop is stopped, which waits for it
	if c := h.nextCall(); !c.reconcile {
		t.Fatal("start-up call was not a Reconcile")
	}
	<-h.runner.firstSync
	dp.setSlow()
	select {
	case <-dp.busy:
	case <-time.After(5 * time.Second):
		t.Fatal("no periodic full reconcile began within 5s of a 100ms sync period")
	}

	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.2")
	select {
	case c := <-dp.calls:
		if c.reconcile {
			t.Fatal("the update went into a Reconcile, want an Apply during the reconcile")
		}
		if got := backends(c.ports[portName("a")]); !slices.Equal(got, []string{"10.0.0.2:8080"}) {
			t.Fatalf("a's backends = %v, want the update's", got)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the update was not applied while the periodic full reconcile ran: it waits for the reconcile")
	}
	if !dp.isSlow() {
		t.Fatal("the reconcile ended before the update was applied; the test proved nothing")
	}

	// Let the reconcile finish: it completes without undoing the update
	// (a's translation is unchanged since, so nothing more is applied).
	dp.finish()
	for {
		r := h.nextSync()
		if r.Err != nil {
			t.Fatalf("sync failed: %v", r.Err)
		}
		if r.Full {
			break
		}
	}
	select {
	case c := <-dp.calls:
		if c.reconcile || len(c.ports) != 0 {
			t.Fatalf("the periodic reconcile made a call (reconcile=%v, %d ports); the dataplane held everything", c.reconcile, len(c.ports))
		}
	default:
	}
}

// A periodic reconcile whose drift check finds the dataplane changed
// behind kpr's back repairs it with a complete Reconcile.
func TestPeriodicReconcileRepairsDriftWithReconcile(t *testing.T) {
	h := newHarness(t, harnessOptions{syncPeriod: 50 * time.Millisecond})
	dp := newCheckingDataplane(h)
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.start()
	h.nextCall()
	dp.mu.Lock()
	dp.drifted = true
	dp.mu.Unlock()
	c := h.nextCall()
	if !c.reconcile {
		t.Fatal("drift was repaired by an Apply, want a Reconcile with the complete state")
	}
	expectPorts(t, c, []string{"a", "b"}, nil)
}

// The periodic reconcile recomputes every Service, as kube-proxy's does:
// a change or deletion the loop was never told about is still applied.
func TestPeriodicReconcileAppliesChangesNobodyQueued(t *testing.T) {
	h := newHarness(t, harnessOptions{syncPeriod: 50 * time.Millisecond})
	newCheckingDataplane(h)
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.start()
	h.nextCall()

	// Behind the tracker's back: b's endpoints change and a disappears.
	h.src.mu.Lock()
	delete(h.src.services, key("a"))
	h.src.mu.Unlock()
	h.tracker = newChangeTracker(h.metrics, h.health, time.Now) // a tracker nobody listens to
	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.9")

	c := h.nextCall()
	if c.reconcile {
		t.Fatal("the dataplane did not drift, yet the changes came in a Reconcile")
	}
	expectPorts(t, c, []string{"b"}, []string{"a"})
	if got := backends(c.ports[portName("b")]); !slices.Equal(got, []string{"10.0.0.9:8080"}) {
		t.Errorf("b's backends = %v", got)
	}
}
