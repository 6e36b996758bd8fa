package watcher

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
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

func TestConnStateFollowsWatchErrorsAndEvents(t *testing.T) {
	now := time.Unix(1000, 0)
	c := &connState{now: func() time.Time { return now }}
	r := cache.NewReflector(&cache.ListWatch{}, &v1.Service{}, cache.NewStore(cache.MetaNamespaceKeyFunc), 0)
	if st := c.status(); !st.Connected {
		t.Fatalf("fresh state = %+v, want connected", st)
	}
	c.watchError(context.Background(), r, errors.New("connection refused"))
	now = now.Add(time.Minute)
	c.watchError(context.Background(), r, errors.New("connection refused again"))
	st := c.status()
	if st.Connected || st.DisconnectedSince == nil || !st.DisconnectedSince.Equal(time.Unix(1000, 0)) || st.LastError != "connection refused again" {
		t.Errorf("after two errors: %+v, want disconnected since the first, with the last error", st)
	}
	c.event()
	if st := c.status(); !st.Connected || st.LastEvent == nil || st.LastError == "" {
		t.Errorf("after an event: %+v, want connected, the old error kept for reference", st)
	}
}
