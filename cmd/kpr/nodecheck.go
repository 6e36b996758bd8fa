package main

import (
	"context"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// checkNode reads this node's Node object once at start-up, as kube-proxy
// reads its own to learn the node's addresses, so that a
// --hostname-override naming no Node is said at once rather than showing
// later as Local traffic policies that find no local endpoint. It also
// makes the GET whose latency the kube-proxy dashboard charts
// (rest_client_request_duration_seconds{verb="GET"}): the informers' own
// requests are watches, which client-go does not time.
func checkNode(ctx context.Context, core rest.Interface, name string, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := core.Get().Resource("nodes").Name(name).Do(ctx).Error()
	switch {
	case apierrors.IsNotFound(err):
		log.Warn("The API server has no Node of this name: set --hostname-override (or the file's hostnameOverride) to this node's Node name, "+
			"or Local traffic policies and topology hints treat no endpoint as local", zap.String("node", name))
	case err != nil:
		log.Warn("Could not read this node's Node object; kpr goes on and watches for it", zap.String("node", name), zap.Error(err))
	}
}
