package watcher

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
