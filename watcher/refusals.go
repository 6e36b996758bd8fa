package watcher

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpr-io/kpr/dataplane"
)

// EventRecorder posts Kubernetes Events; client-go's record.EventRecorder
// implements it.
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{})
}

// refusalReporter tells users about the ServicePorts a dataplane refuses
// (see dataplane.Refuser): a Warning Event on the Service when a port is
// refused, a Normal one when it is programmed after all, and the
// kpr_service_ports_refused gauge. The Event is what reaches the Service's
// owner, who may be a tenant without access to kpr's logs or metrics.
type refusalReporter struct {
	dp     dataplane.Refuser
	src    objectSource
	events EventRecorder // nil: no Events
	gauge  *prometheus.GaugeVec
	log    *zap.Logger
	// last is what the previous report saw.
	last map[dataplane.ServicePortName]dataplane.Refusal
}

// Reason of the Normal Event on a Service whose refused port now fits.
const eventReasonProgrammed = "Programmed"

func newRefusalReporter(dp dataplane.Refuser, src objectSource, events EventRecorder, gauge *prometheus.GaugeVec, log *zap.Logger) *refusalReporter {
	// Exported at zero from the start, so an alert on it sees the series.
	gauge.WithLabelValues(dataplane.RefusedMapFull).Set(0)
	return &refusalReporter{dp: dp, src: src, events: events, gauge: gauge, log: log}
}

// report runs after every successful sync, in the sync loop. It only acts
// on changes, so a Service refused for hours gets one Event, not one per
// sync.
func (r *refusalReporter) report() {
	now := r.dp.Refused()
	counts := map[string]int{}
	for _, refusal := range r.last {
		counts[refusal.Reason] = 0 // reasons that vanished go back to zero
	}
	for name, refusal := range now {
		counts[refusal.Reason]++
		if old, ok := r.last[name]; ok && old.Reason == refusal.Reason {
			continue
		}
		r.event(name, v1.EventTypeWarning, refusal.Reason,
			"Service port %s is not programmed on this node: %s", portOf(name), refusal.Message)
	}
	for name, refusal := range r.last {
		if _, ok := now[name]; !ok {
			r.event(name, v1.EventTypeNormal, eventReasonProgrammed,
				"Service port %s, refused earlier (%s), is programmed on this node now", portOf(name), refusal.Reason)
		}
	}
	for reason, n := range counts {
		r.gauge.WithLabelValues(reason).Set(float64(n))
	}
	r.last = now
}

// event posts an Event on name's Service, if it still exists: a deleted
// Service's refusal ended with it.
func (r *refusalReporter) event(name dataplane.ServicePortName, eventType, reason, format string, args ...interface{}) {
	if r.events == nil {
		return
	}
	svc, ok := r.src.Service(serviceName{Namespace: name.Namespace, Name: name.Name})
	if !ok {
		return
	}
	r.events.Eventf(svc, eventType, reason, format, args...)
}

// portOf names a ServicePort within its Service, as "http/TCP".
func portOf(name dataplane.ServicePortName) string {
	if name.Port == "" {
		return name.Protocol.String()
	}
	return name.Port + "/" + name.Protocol.String()
}
