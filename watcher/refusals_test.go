package watcher

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/metrics"
)

type fakeRefuser struct {
	refused map[dataplane.ServicePortName]dataplane.Refusal
}

func (f *fakeRefuser) Refused() map[dataplane.ServicePortName]dataplane.Refusal {
	out := map[dataplane.ServicePortName]dataplane.Refusal{}
	for k, v := range f.refused {
		out[k] = v
	}
	return out
}

// A refused port gets one Warning Event however many syncs it stays
// refused, a Normal one once programmed, and the gauge follows.
func TestRefusalsAreReportedOnceAsEventsAndGauge(t *testing.T) {
	big := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "big", UID: "uid-big"}}
	src := &fakeSource{services: map[serviceName]*v1.Service{{Namespace: testNamespace, Name: "big"}: big}}
	dp := &fakeRefuser{}
	events := record.NewFakeRecorder(10)
	m := metrics.New()
	r := newRefusalReporter(dp, src, events, m.ServicePortsRefused, zap.NewNop())
	gauge := m.ServicePortsRefused.WithLabelValues(dataplane.RefusedMapFull)

	r.report()
	if got := gaugeValue(t, gauge); got != 0 || len(events.Events) != 0 {
		t.Fatalf("nothing refused: gauge %v, %d events", got, len(events.Events))
	}
	port := dataplane.ServicePortName{Namespace: testNamespace, Name: "big", Port: "http", Protocol: dataplane.TCP}
	dp.refused = map[dataplane.ServicePortName]dataplane.Refusal{
		port: {Reason: dataplane.RefusedMapFull, Message: "raise --map-size-services"},
	}
	for i := 0; i < 3; i++ {
		r.report()
	}
	if got := gaugeValue(t, gauge); got != 1 {
		t.Fatalf("gauge = %v with one refused port, want 1", got)
	}
	if n := len(events.Events); n != 1 {
		t.Fatalf("%d events after three syncs of one refusal, want 1", n)
	}
	if e := <-events.Events; !strings.HasPrefix(e, "Warning MapFull ") || !strings.Contains(e, "http/TCP") || !strings.Contains(e, "--map-size-services") {
		t.Fatalf("event %q: want a Warning MapFull naming the port and the flag", e)
	}

	dp.refused = nil
	r.report()
	if got := gaugeValue(t, gauge); got != 0 {
		t.Fatalf("gauge = %v once programmed, want 0", got)
	}
	if e := <-events.Events; !strings.HasPrefix(e, "Normal Programmed ") {
		t.Fatalf("event %q: want Normal Programmed", e)
	}
}
