package watcher

import (
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

// Every sync logs one info line that says what it wrote: the Services by
// name, their ServicePorts and frontends, and the time it took.
func TestEverySyncLogsOneSummaryLine(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.start()
	h.syncSeeingAll()

	full := h.logs.FilterMessage("Synced the dataplane").All()
	if len(full) != 1 || full[0].Level != zapcore.InfoLevel {
		t.Fatalf("after the start-up reconcile: %d info summary lines, want 1: %v", len(full), full)
	}
	f := full[0].ContextMap()
	if f["servicesReconciled"] != int64(2) || f["servicePortsWritten"] != int64(2) || f["frontendsWritten"] != int64(2) || f["full"] != true {
		t.Errorf("full reconcile summary = %v, want 2 Services, 2 ServicePorts, 2 frontends, full", f)
	}

	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.1")
	h.deleteService("b")
	h.syncSeeingAll()
	lines := h.logs.FilterMessage("Synced the dataplane").All()
	if len(lines) != 2 {
		t.Fatalf("%d summary lines after one more sync, want 2", len(lines))
	}
	f = lines[1].ContextMap()
	names, _ := f["services"].([]interface{})
	if f["servicesChanged"] != int64(2) || len(names) != 2 || names[0] != testNamespace+"/a" || names[1] != testNamespace+"/b" ||
		f["servicePortsWritten"] != int64(2) || f["servicePortsDeleted"] != int64(1) || f["frontendsWritten"] != int64(1) {
		t.Errorf("partial sync summary = %v, want Services a and b, 2 ServicePorts (1 deleted), 1 frontend", f)
	}
	if _, ok := f["took"]; !ok {
		t.Errorf("summary has no took field: %v", f)
	}
}

// A failed sync's error line names the Services whose changes it leaves
// queued.
func TestFailedSyncNamesItsServices(t *testing.T) {
	h := newHarness(t, harnessOptions{failFirstCalls: 1})
	h.putService("a", "10.96.0.1")
	h.start()
	const msg = "Syncing the dataplane failed; the changes stay queued and will be retried (kpr status shows recent failures)"
	waitFor(t, func() bool { return h.logs.FilterMessage(msg).Len() > 0 })
	f := h.logs.FilterMessage(msg).All()[0].ContextMap()
	names, _ := f["services"].([]interface{})
	if f["servicesChanged"] != int64(1) || len(names) != 1 || names[0] != testNamespace+"/a" || f["error"] == nil {
		t.Errorf("failure line = %v, want Service a named, and the error", f)
	}
}
