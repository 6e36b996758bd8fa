package watcher

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// Each change of the connection's state is logged once: an outage and its
// end, watches gone silent and their return.
func TestLogAPIStateLogsEachChange(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	c := newConnState(clock)
	c.done(nil)
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go logAPIState(ctx, c, zap.New(core), time.Millisecond)

	waitLogged := func(n int, msg string) {
		t.Helper()
		waitFor(t, func() bool { return logs.Len() >= n })
		if got := logs.All()[n-1].Message; len(got) < len(msg) || got[:len(msg)] != msg {
			t.Fatalf("log line %d = %q, want it to start %q", n, got, msg)
		}
	}
	c.done(errors.New("connection refused"))
	waitLogged(1, "The API server does not answer kpr's list and watch calls")
	c.done(nil)
	waitLogged(2, "The API server answers kpr's calls again")
	advance(watchSilenceLimit + time.Second)
	waitLogged(3, "The API server's watches have delivered nothing")
	c.heard()
	waitLogged(4, "The API server's watches deliver again")
	time.Sleep(20 * time.Millisecond)
	if logs.Len() != 4 {
		t.Errorf("logged %d lines, want each change once: %v", logs.Len(), logs.All())
	}
}
