package socketlb

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/kpr-io/kpr/apiclient"
)

// Run watches the Pods bound to nodeName and the RuntimeClasses, hands
// them to c, and retries the pods whose namespaces are not there yet, until
// ctx ends. Once the first lists are in, it prunes the map of pods gone
// while kpr was away, and closes synced.
func (c *Controller) Run(ctx context.Context, client *apiclient.Clients, nodeName string, synced chan<- struct{}) error {
	onNode := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}
	pods := cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(client.Core, "pods", metav1.NamespaceAll, onNode),
		&v1.Pod{}, 0, cache.Indexers{})
	if err := pods.SetTransform(trimPod); err != nil {
		return fmt.Errorf("watch the node's pods: %w", err)
	}
	classes := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(client.Node, "runtimeclasses", metav1.NamespaceAll, fields.Everything()),
		&nodev1.RuntimeClass{}, 0, cache.Indexers{})

	_, err := classes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.runtimeClass(obj, false) },
		UpdateFunc: func(_, obj any) { c.runtimeClass(obj, false) },
		DeleteFunc: func(obj any) { c.runtimeClass(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watch RuntimeClasses: %w", err)
	}
	_, err = pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.pod(obj, false) },
		UpdateFunc: func(_, obj any) { c.pod(obj, false) },
		DeleteFunc: func(obj any) { c.pod(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watch the node's pods: %w", err)
	}
	go classes.Run(ctx.Done())
	// The classes first, so that the first decision for each pod knows
	// its runtime.
	if !cache.WaitForCacheSync(ctx.Done(), classes.HasSynced) {
		return ctx.Err()
	}
	go pods.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced) {
		return ctx.Err()
	}
	if err := c.Prune(); err != nil {
		c.log.Warn("cannot remove the bypass entries of pods gone while kpr was away", zap.Error(err))
	}
	close(synced)

	timer := time.NewTimer(firstRetry)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		// Pace the loop by the next retry due, but look at least every
		// firstRetry: an event may have added a pod to retry.
		wait := firstRetry
		if next := c.RetryDue(); !next.IsZero() {
			wait = max(min(time.Until(next), firstRetry), time.Millisecond)
		}
		timer.Reset(wait)
	}
}

// unwrap returns an event's object, and whether it was deleted: a delete
// the informer missed comes as a tombstone holding the last state known.
func unwrap(obj any, deleted bool) (any, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return tomb.Obj, true
	}
	return obj, deleted
}

func (c *Controller) pod(obj any, deleted bool) {
	obj, deleted = unwrap(obj, deleted)
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if deleted {
		c.Delete(pod.UID)
		return
	}
	c.Update(pod)
}

func (c *Controller) runtimeClass(obj any, deleted bool) {
	obj, deleted = unwrap(obj, deleted)
	rc, ok := obj.(*nodev1.RuntimeClass)
	if !ok {
		return
	}
	handler := rc.Handler
	if deleted {
		handler = ""
	}
	c.SetRuntimeClass(rc.Name, handler)
}

// trimPod keeps of a Pod what the decision and the logs read: a node's
// pods carry large specs (containers, volumes, env) that kpr never looks
// at.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return obj, nil
	}
	kept := map[string]string{}
	for _, k := range []string{Annotation, istioSidecarStatus, linkerdProxyVersion} {
		if v, ok := pod.Annotations[k]; ok {
			kept[k] = v
		}
	}
	var labels map[string]string
	if v, ok := pod.Labels[kubevirtLabel]; ok {
		labels = map[string]string{kubevirtLabel: v}
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, Annotations: kept, Labels: labels},
		Spec: v1.PodSpec{NodeName: pod.Spec.NodeName, HostNetwork: pod.Spec.HostNetwork,
			RuntimeClassName: pod.Spec.RuntimeClassName},
		Status: v1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}
