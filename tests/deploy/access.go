package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Access is one request a ServiceAccount may or may not make.
type Access struct{ Verb, Group, Resource, Subresource, Namespace, Name string }

// Needed is what kpr does with the API: read Services, EndpointSlices and
// Nodes, post Events about the Services it refuses, and read the
// kube-system Namespace, whose UID is the cluster's Maglev hash seed.
var Needed = []Access{
	{"list", "", "services", "", "", ""}, {"watch", "", "services", "", "", ""}, {"get", "", "services", "", "default", ""},
	{"list", "discovery.k8s.io", "endpointslices", "", "", ""}, {"watch", "discovery.k8s.io", "endpointslices", "", "", ""},
	{"get", "", "nodes", "", "", ""}, {"list", "", "nodes", "", "", ""}, {"watch", "", "nodes", "", "", ""},
	{"create", "", "events", "", "default", ""}, {"patch", "", "events", "", "default", ""},
	{"get", "", "namespaces", "", "", "kube-system"},
}

// NotNeeded is a sample of what kpr must not be able to do: read Secrets
// (CheckLeastPrivilege adds those of kpr's own namespace) or Pods, exec
// into Pods, write Services, EndpointSlices or Nodes.
var NotNeeded = []Access{
	{"get", "", "secrets", "", "kube-system", ""}, {"list", "", "secrets", "", "", ""},
	{"create", "", "pods", "exec", "default", ""}, {"get", "", "pods", "", "default", ""},
	{"create", "", "services", "", "default", ""}, {"update", "", "services", "", "default", ""},
	{"patch", "", "services", "", "default", ""}, {"delete", "", "services", "", "default", ""},
	{"create", "discovery.k8s.io", "endpointslices", "", "default", ""}, {"update", "discovery.k8s.io", "endpointslices", "", "default", ""},
	{"delete", "discovery.k8s.io", "endpointslices", "", "default", ""},
	{"update", "", "events", "", "default", ""}, {"update", "", "nodes", "", "", ""}, {"list", "", "configmaps", "", "", ""},
	{"get", "", "namespaces", "", "", "default"}, {"list", "", "namespaces", "", "", ""}, {"update", "", "namespaces", "", "", "kube-system"},
}

// PerPodSocketLB is what --socket-lb per-pod (the default) and host-only
// read beside Needed: the Pods of each node and the RuntimeClasses. A
// chart with socketLB: all does not grant it.
var PerPodSocketLB = []Access{
	{"list", "", "pods", "", "", ""}, {"watch", "", "pods", "", "", ""},
	{"list", "node.k8s.io", "runtimeclasses", "", "", ""}, {"watch", "node.k8s.io", "runtimeclasses", "", "", ""},
}

// CheckLeastPrivilege asks the API server, through SubjectAccessReviews,
// whether the ServiceAccount namespace/name may make each request of
// Needed (it must) and of NotNeeded (it must not), and of PerPodSocketLB
// (it must if perPod, else it must not). It returns one error per wrong
// answer. The ServiceAccount's bindings must exist.
func CheckLeastPrivilege(ctx context.Context, client kubernetes.Interface, namespace, name string, perPod bool) error {
	user := "system:serviceaccount:" + namespace + ":" + name
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
	allowed := func(ac Access) (bool, string, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: ac.Verb, Group: ac.Group, Resource: ac.Resource, Subresource: ac.Subresource, Namespace: ac.Namespace, Name: ac.Name},
		}}
		out, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, "", fmt.Errorf("SubjectAccessReview for %s: %w", user, err)
		}
		return out.Status.Allowed, out.Status.Reason, nil
	}
	// The RBAC authorizer learns new roles and bindings through its
	// informers, a moment after they are created: wait until the first
	// grant shows before judging them all.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok, _, err := allowed(Needed[0]); err == nil && ok {
			break
		}
	}
	needed := Needed
	notNeeded := append([]Access{{"get", "", "secrets", "", namespace, ""}}, NotNeeded...)
	if perPod {
		needed = append(slices.Clone(needed), PerPodSocketLB...)
	} else {
		notNeeded = append(notNeeded, PerPodSocketLB...)
	}
	var errs []error
	for _, c := range []struct {
		list []Access
		want bool
	}{{needed, true}, {notNeeded, false}} {
		for _, ac := range c.list {
			ok, reason, err := allowed(ac)
			if err != nil {
				return err
			}
			if ok != c.want {
				errs = append(errs, fmt.Errorf("%s %s %s/%s in %q: allowed=%v, want %v (%s)", user, ac.Verb, ac.Resource, ac.Subresource,
					ac.Namespace, ok, c.want, reason))
			}
		}
	}
	return errors.Join(errs...)
}
