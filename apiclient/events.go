package apiclient

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// EventRecorder posts core/v1 Events about Services. Eventf only queues
// the Event; Run posts the queue from a goroutine of its own, so a slow or
// unreachable API server never holds up the sync loop, and a full queue
// drops Events (with a log line) rather than blocking.
//
// client-go's record package would do this too, but it imports client-go's
// global scheme and with it every API group, the very thing Clients avoids.
// kpr needs no aggregation or spam filter: it posts an Event only when a
// Service's refusal starts or ends.
type EventRecorder struct {
	core   Clients
	source corev1.EventSource
	queue  chan *corev1.Event
	log    *zap.Logger
}

// eventQueue is how many Events may wait for the API server.
const eventQueue = 256

// NewEventRecorder returns a recorder whose Events name component and host
// (the node) as their source, as kube-proxy's do.
func NewEventRecorder(c *Clients, component, host string, log *zap.Logger) *EventRecorder {
	if log == nil {
		log = zap.NewNop()
	}
	return &EventRecorder{core: *c, source: corev1.EventSource{Component: component, Host: host},
		queue: make(chan *corev1.Event, eventQueue), log: log}
}

// Eventf queues an Event about object, which must be a core/v1 object
// with metadata (a Service).
func (r *EventRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	obj, err := meta.Accessor(object)
	if err != nil {
		r.log.Warn("cannot post an Event about an object without metadata", zap.String("reason", reason), zap.Error(err))
		return
	}
	kind := object.GetObjectKind().GroupVersionKind().Kind
	if kind == "" {
		kinds, _, err := Scheme.ObjectKinds(object)
		if err != nil || len(kinds) == 0 {
			r.log.Warn("cannot post an Event about an object of an unknown kind", zap.String("reason", reason), zap.Error(err))
			return
		}
		kind = kinds[0].Kind
	}
	now := metav1.Now()
	// An Event about a cluster-scoped object (the Node) goes to the
	// default namespace, as client-go's recorder puts it.
	ns := obj.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// As client-go's recorder names them: unique per object and moment.
			Name:      fmt.Sprintf("%s.%x", obj.GetName(), now.UnixNano()),
			Namespace: ns,
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: "v1", Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName(),
			UID: obj.GetUID(), ResourceVersion: obj.GetResourceVersion(),
		},
		Reason:         reason,
		Message:        fmt.Sprintf(messageFmt, args...),
		Type:           eventtype,
		Source:         r.source,
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	select {
	case r.queue <- ev:
	default:
		r.log.Warn("Event queue full; dropping an Event (the API server is slow or unreachable)",
			zap.String("object", obj.GetNamespace()+"/"+obj.GetName()), zap.String("reason", reason))
	}
}

// Run posts queued Events until ctx ends. A failed post is logged and not
// retried: the Event describes a state that the metrics and logs show too.
func (r *EventRecorder) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.queue:
			post, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := r.core.Core.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(post).Error()
			cancel()
			if err != nil {
				r.log.Warn("posting an Event failed", zap.String("object", ev.InvolvedObject.Namespace+"/"+ev.InvolvedObject.Name),
					zap.String("reason", ev.Reason), zap.Error(err))
			}
		}
	}
}
