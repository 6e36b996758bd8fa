// Package socketlb chooses, pod by pod, whether kpr's socket hooks serve a
// pod's sockets (kpr run --socket-lb per-pod), and keeps the hooks' list
// of bypassed pods (kpr_sock_bypass) in step with the Pods on the node.
//
// The socket hooks translate a Service address inside connect() and
// sendmsg(), so that no packet ever carries it. Two kinds of pod need the
// Service address on the wire instead:
//   - pods whose sockets are not in the node's kernel (a Kata VM, a gVisor
//     sandbox, a KubeVirt VM): no socket hook runs for them at all;
//   - pods with a service-mesh sidecar, whose redirect reads the original
//     destination (SO_ORIGINAL_DST) to route by Service.
//
// A bypassed pod keeps the Service address in its syscalls, and its packets
// meet the Service at packet level.
package socketlb

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Annotation is kpr's own per-pod switch: AnnotationBypass leaves the pod
// to the packet path, AnnotationServe keeps it with the socket hooks even
// where a mesh or a runtime would bypass it.
const (
	Annotation       = "kpr.io/socket-lb"
	AnnotationBypass = "bypass"
	AnnotationServe  = "serve"
)

// The marks of an injected sidecar: each mesh's injector sets its
// annotation on every pod it injects, and never on others.
const (
	istioSidecarStatus  = "sidecar.istio.io/status"
	linkerdProxyVersion = "linkerd.io/proxy-version"
	// KubeVirt runs each VM in a virt-launcher pod, whose guest's packets
	// reach the pod's interface already addressed.
	kubevirtLabel         = "kubevirt.io"
	kubevirtLauncherValue = "virt-launcher"
)

// DefaultSandboxHandlers are the RuntimeClass handlers whose pods run in a
// VM or with a network stack of their own: Kata Containers (one handler per
// hypervisor) and gVisor. A trailing * matches any suffix.
var DefaultSandboxHandlers = []string{"kata*", "runsc*", "gvisor*"}

// Reason says why a pod is bypassed.
type Reason int

const (
	NotBypassed Reason = iota
	ByAnnotation
	ByMesh
	BySandbox
	// ByMode: --socket-lb host-only leaves every pod to the packet path.
	ByMode
)

func (r Reason) String() string {
	switch r {
	case ByAnnotation:
		return "annotation"
	case ByMesh:
		return "mesh"
	case BySandbox:
		return "sandbox"
	case ByMode:
		return "host-only"
	default:
		return "none"
	}
}

// Decision is what the socket hooks do with one pod, and why, in words an
// operator reads in kpr's logs and status.
type Decision struct {
	Bypass bool
	Reason Reason
	Why    string
}

// Rules decide per pod.
type Rules struct {
	// SandboxHandlers are the RuntimeClass handlers whose pods are
	// bypassed (patterns as DefaultSandboxHandlers).
	SandboxHandlers []string
	// HostOnly bypasses every pod (--socket-lb host-only): the socket
	// hooks serve only the node's own sockets.
	HostOnly bool
}

// Decide chooses for pod, whose RuntimeClass (if it names one) has the
// given handler. The annotation wins over everything else; a value other
// than the two it takes is ignored, with the reason in Why.
func (r Rules) Decide(pod *v1.Pod, handler string) Decision {
	if pod.Spec.HostNetwork {
		return Decision{Why: "host network: its sockets are the node's own, and are served with the node's"}
	}
	if r.HostOnly {
		return Decision{Bypass: true, Reason: ByMode, Why: "--socket-lb host-only: the socket hooks serve only the node's own sockets"}
	}
	note := ""
	switch v, set := pod.Annotations[Annotation]; {
	case !set:
	case v == AnnotationBypass:
		return Decision{Bypass: true, Reason: ByAnnotation, Why: fmt.Sprintf("annotation %s: %s", Annotation, v)}
	case v == AnnotationServe:
		return Decision{Why: fmt.Sprintf("annotation %s: %s", Annotation, v)}
	default:
		note = fmt.Sprintf(" (annotation %s: %q ignored: want %q or %q)", Annotation, v, AnnotationBypass, AnnotationServe)
	}
	if _, ok := pod.Annotations[istioSidecarStatus]; ok {
		return Decision{Bypass: true, Reason: ByMesh, Why: "Istio sidecar injected (" + istioSidecarStatus + ")" + note}
	}
	if _, ok := pod.Annotations[linkerdProxyVersion]; ok {
		return Decision{Bypass: true, Reason: ByMesh, Why: "Linkerd proxy injected (" + linkerdProxyVersion + ")" + note}
	}
	if pod.Labels[kubevirtLabel] == kubevirtLauncherValue {
		return Decision{Bypass: true, Reason: BySandbox, Why: "KubeVirt VM (" + kubevirtLabel + ": " + kubevirtLauncherValue + ")" + note}
	}
	if handler != "" && r.sandbox(handler) {
		return Decision{Bypass: true, Reason: BySandbox,
			Why: fmt.Sprintf("RuntimeClass %s runs handler %s, a VM or sandbox runtime%s", RuntimeClassName(pod), handler, note)}
	}
	return Decision{Why: "served by the socket hooks" + note}
}

func (r Rules) sandbox(handler string) bool {
	for _, pattern := range r.SandboxHandlers {
		if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
			if strings.HasPrefix(handler, prefix) {
				return true
			}
		} else if handler == pattern {
			return true
		}
	}
	return false
}

// RuntimeClassName is the pod's RuntimeClass, or "" for the default.
func RuntimeClassName(pod *v1.Pod) string {
	if pod.Spec.RuntimeClassName == nil {
		return ""
	}
	return *pod.Spec.RuntimeClassName
}
