package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/tests/cluster"
)

// The start-up read of the Node says when --hostname-override names no
// Node and says nothing when it does. (That the read is timed into
// rest_client_request_duration_seconds is checked on the real binary by
// tests/e2e's TestKubeProxyDashboard: in this test binary envtest's
// controller-runtime has taken client-go's one metrics registration.)
func TestCheckNode(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.CreateNode(ctx, "node-a", []string{"192.168.77.10"}, nil); err != nil {
		t.Fatal(err)
	}
	client, err := apiclient.ForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	log := zap.New(core)

	checkNode(ctx, client.Core, "node-a", log)
	if n := logs.Len(); n != 0 {
		t.Fatalf("an existing Node drew %d warnings: %v", n, logs.All())
	}
	checkNode(ctx, client.Core, "node-typo", log)
	warned := logs.TakeAll()
	if len(warned) != 1 || !strings.Contains(warned[0].Message, "--hostname-override") {
		t.Fatalf("a missing Node drew %v, want one warning naming --hostname-override", warned)
	}

}
