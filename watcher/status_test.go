package watcher

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

func TestStatusReportsSuccessesAndRecentFailures(t *testing.T) {
	h := newHarness(t, harnessOptions{failFirstCalls: 2})
	h.putService("a", "10.96.0.1")
	h.start()
	h.syncSeeingAll()

	st := h.runner.status()
	if len(st.RecentFailures) != 2 || !strings.Contains(st.RecentFailures[0].Error, "reconcile") || !st.RecentFailures[0].Full {
		t.Errorf("recent failures = %+v, want the 2 failed full reconciles", st.RecentFailures)
	}
	if st.LastSuccessfulSync == nil || st.LastSuccessfulFullSync == nil || st.LastSuccessfulSync.ServicePorts != 1 ||
		st.LastSuccessfulSync.At.Before(st.RecentFailures[1].At) {
		t.Errorf("last successful sync = %+v, want the full reconcile of 1 ServicePort after the failures", st.LastSuccessfulSync)
	}
}

func TestConnStateFollowsListAndWatchCalls(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newConnState(func() time.Time { return now })
	var listErr, watchErr error
	release := make(chan struct{})
	lw := c.follow(&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) { return &v1.ServiceList{}, listErr },
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			<-release
			return watch.NewFake(), watchErr
		},
	})
	if _, err := lw.List(metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if st := c.status(); !st.Connected {
		t.Fatalf("after a good list: %+v, want connected", st)
	}

	// A watch held by the client while the API server is away.
	done := make(chan struct{})
	go func() { _, _ = lw.Watch(metav1.ListOptions{}); close(done) }()
	waitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.waiting) == 1 })
	if st := c.status(); !st.Connected {
		t.Errorf("a watch waiting for 0s: %+v, want still connected", st)
	}
	now = now.Add(10 * time.Second)
	if st := c.status(); st.Connected || st.DisconnectedSince == nil || !st.DisconnectedSince.Equal(time.Unix(1000, 0)) || !strings.Contains(st.LastError, "waited for the API server") {
		t.Errorf("a watch waiting for 10s: %+v, want disconnected since it started", st)
	}
	watchErr = errors.New("connection refused")
	close(release)
	<-done
	now = now.Add(time.Minute)
	if st := c.status(); st.Connected || !st.DisconnectedSince.Equal(time.Unix(1010, 0)) || st.LastError != "connection refused" {
		t.Errorf("after the watch failed: %+v, want disconnected since the failure, with its error", st)
	}

	if _, err := lw.List(metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	c.event()
	if st := c.status(); !st.Connected || st.LastEvent == nil || st.LastErrorAt == nil {
		t.Errorf("after a good list: %+v, want connected, the old error kept for reference", st)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A watch that stays open and delivers nothing, not even a bookmark, for
// watchSilenceLimit is reported stuck, while the calls themselves look
// fine; any item on it, a bookmark too, counts as hearing from the API.
// A list that hangs counts as a disconnection, as a waiting watch does.
func TestConnStateCallsSilentWatchesStuck(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newConnState(func() time.Time { return now })
	fake := watch.NewFake()
	hang := make(chan struct{})
	listHangs := false
	lw := c.follow(&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			if listHangs {
				<-hang
			}
			return &v1.ServiceList{}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return fake, nil },
	})
	if _, err := lw.List(metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := lw.Watch(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := c.status(); !st.Connected || st.Stuck || st.LastHeard == nil || !st.LastHeard.Equal(now) {
		t.Fatalf("after a list and a watch: %+v, want connected, heard now", st)
	}

	now = now.Add(2 * time.Minute)
	go fake.Action(watch.Bookmark, &v1.Service{})
	if e := <-w.ResultChan(); e.Type != watch.Bookmark {
		t.Fatalf("the watch passed on %v, want the bookmark", e.Type)
	}
	if st := c.status(); st.Stuck || !st.LastHeard.Equal(now) {
		t.Errorf("after a bookmark: %+v, want heard at the bookmark, not stuck", st)
	}
	heard := now
	now = now.Add(time.Second)
	go fake.Error(&metav1.Status{Message: "http2: client connection lost"})
	<-w.ResultChan()
	if st := c.status(); !st.LastHeard.Equal(heard) {
		t.Errorf("after an Error item: last heard %s, want the bookmark's %s: the error may be the client's own", st.LastHeard, heard)
	}
	now = now.Add(watchSilenceLimit)
	st := c.status()
	if !st.Connected || !st.Stuck {
		t.Errorf("silent for %s: %+v, want connected but stuck", watchSilenceLimit+time.Second, st)
	}
	reg := prometheus.NewRegistry()
	if err := registerAPIMetrics(reg, c); err != nil {
		t.Fatal(err)
	}
	if got := gathered(t, reg, "kpr_api_last_heard_timestamp_seconds"); got != float64(st.LastHeard.Unix()) {
		t.Errorf("kpr_api_last_heard_timestamp_seconds = %v, want %d", got, st.LastHeard.Unix())
	}

	listHangs = true
	go func() { _, _ = lw.List(metav1.ListOptions{}) }()
	waitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.waiting) == 1 })
	now = now.Add(apiWaitLimit + time.Second)
	if st := c.status(); st.Connected || st.Stuck || !strings.Contains(st.LastError, "a list or watch call has waited") {
		t.Errorf("a list waiting for %s: %+v, want disconnected, and then not called stuck", apiWaitLimit+time.Second, st)
	}
	if got := gathered(t, reg, "kpr_api_connected"); got != 0 {
		t.Errorf("kpr_api_connected = %v while a list waits, want 0", got)
	}
	close(hang)
	w.Stop()
}

// gathered is the value of the gauge name in reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestStatusSaysWhatTheDataplaneServes: a sync that changes nothing writes
// no ServicePort, and the status still says how many the dataplane holds,
// so that kpr status does not read as "serving nothing" between changes.
func TestStatusSaysWhatTheDataplaneServes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.start()
	h.syncSeeingAll()

	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.2")
	h.syncSeeingAll()
	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.2")
	if r := h.syncSeeingAll(); r.ServicePorts != 0 || r.Held != 2 {
		t.Errorf("a sync that changed nothing: wrote %d, holds %d; want 0 and 2", r.ServicePorts, r.Held)
	}
	if s := h.runner.status().LastSuccessfulSync; s == nil || s.HeldServicePorts != 2 {
		t.Errorf("status after it: %+v, want 2 ServicePorts held", s)
	}

	h.deleteService("a")
	if r := h.syncSeeingAll(); r.Held != 1 {
		t.Errorf("after a's deletion the dataplane holds %d ServicePorts, want 1", r.Held)
	}
}
