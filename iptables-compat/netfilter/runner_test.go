package netfilter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// kpr run passes the context SIGTERM cancels: a command still running
// then is killed, so kpr exits at once instead of after a restore that
// can take seconds, and no command starts after it.
func TestExecRunnerEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := ExecRunner{Context: ctx}
	go func() {
		time.Sleep(200 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	if _, err := r.Run("sleep", []string{"20"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("a command killed by its context: err = %v, want it to say the context ended (context.Canceled)", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the command ran on for %s after its context ended", took)
	}
	_, err := r.Run("true", nil, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a command after the context ended: err = %v, want it not run (context.Canceled)", err)
	}
}
