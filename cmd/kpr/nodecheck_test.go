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
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/cluster"
)

// The start-up read of the Node says when --hostname-override names no
// Node and says nothing when it does, and is timed into
// rest_client_request_duration_seconds like every API request.
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
	// New hands client-go the request metrics (once per process); reads
	// are counted from here on.
	m := metrics.New()
	apiHost := strings.TrimPrefix(c.Config.Host, "https://")
	timedBefore := timedGets(t, m, apiHost)

	checkNode(ctx, client.Core, "node-a", log)
	if n := logs.Len(); n != 0 {
		t.Fatalf("an existing Node drew %d warnings: %v", n, logs.All())
	}
	checkNode(ctx, client.Core, "node-typo", log)
	warned := logs.TakeAll()
	if len(warned) != 1 || !strings.Contains(warned[0].Message, "--hostname-override") {
		t.Fatalf("a missing Node drew %v, want one warning naming --hostname-override", warned)
	}
	if n := timedGets(t, m, apiHost) - timedBefore; n != 2 {
		t.Errorf("rest_client_request_duration_seconds counted %d GETs to %s during the two reads, want 2", n, apiHost)
	}
}

// timedGets is how many GET requests to host client-go has timed into m.
func timedGets(t *testing.T, m *metrics.Metrics, host string) uint64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "rest_client_request_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			if labelOf(s, "verb") == "GET" && labelOf(s, "host") == host {
				return s.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}
