package main

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// bindRetryInterval is how long kpr waits before it tries a health or
// metrics server again, as kube-proxy waits 5 s.
const bindRetryInterval = 5 * time.Second

// serveRetrying runs serve until ctx ends. With hardFail (kube-proxy's
// --bind-address-hard-fail) its first error is returned, which stops kpr.
// Without it, as kube-proxy's default, an error (a port another process
// holds, say) is logged and serve is tried again every interval, and the
// dataplane goes on meanwhile: a busy metrics port must not take Services
// down with it.
func serveRetrying(ctx context.Context, what string, hardFail bool, interval time.Duration, log *zap.Logger, serve func(context.Context) error) error {
	for {
		err := serve(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if hardFail {
			return err
		}
		log.Error("The "+what+" server failed; trying again (--bind-address-hard-fail makes this fatal)",
			zap.Duration("retryIn", interval), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
