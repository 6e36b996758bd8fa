package socketlb

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func podWith(annotations, labels map[string]string, runtimeClass string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1", Annotations: annotations, Labels: labels}}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	return p
}

func TestDecide(t *testing.T) {
	rules := Rules{SandboxHandlers: DefaultSandboxHandlers}
	istio := map[string]string{istioSidecarStatus: "{}"}
	for _, c := range []struct {
		name    string
		pod     *v1.Pod
		handler string
		bypass  bool
		reason  Reason
		why     string // a part of Decision.Why
	}{
		{"plain pod", podWith(nil, nil, ""), "", false, NotBypassed, "served"},
		{"istio", podWith(istio, nil, ""), "", true, ByMesh, "Istio"},
		{"linkerd", podWith(map[string]string{linkerdProxyVersion: "edge-24.1.1"}, nil, ""), "", true, ByMesh, "Linkerd"},
		{"kubevirt", podWith(nil, map[string]string{kubevirtLabel: kubevirtLauncherValue}, ""), "", true, BySandbox, "KubeVirt"},
		{"kata", podWith(nil, nil, "kata"), "kata-qemu", true, BySandbox, "RuntimeClass kata runs handler kata-qemu"},
		{"gvisor", podWith(nil, nil, "gvisor"), "runsc", true, BySandbox, "runsc"},
		{"runc class", podWith(nil, nil, "fast"), "runc", false, NotBypassed, "served"},
		{"annotation bypass", podWith(map[string]string{Annotation: AnnotationBypass}, nil, ""), "", true, ByAnnotation, "kpr.io/socket-lb: bypass"},
		{"annotation serve beats istio", podWith(map[string]string{Annotation: AnnotationServe, istioSidecarStatus: "{}"}, nil, ""), "", false, NotBypassed, "serve"},
		{"annotation serve beats kata", podWith(map[string]string{Annotation: AnnotationServe}, nil, "kata"), "kata", false, NotBypassed, "serve"},
		{"bad annotation ignored", podWith(map[string]string{Annotation: "off", istioSidecarStatus: "{}"}, nil, ""), "", true, ByMesh, `"off" ignored`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := rules.Decide(c.pod, c.handler)
			if d.Bypass != c.bypass || d.Reason != c.reason || !strings.Contains(d.Why, c.why) {
				t.Errorf("Decide = %+v; want bypass %v, reason %v, why containing %q", d, c.bypass, c.reason, c.why)
			}
		})
	}
}

func TestHostNetworkPodIsNeverBypassed(t *testing.T) {
	p := podWith(map[string]string{Annotation: AnnotationBypass}, nil, "")
	p.Spec.HostNetwork = true
	if d := (Rules{}).Decide(p, ""); d.Bypass || !strings.Contains(d.Why, "host network") {
		t.Errorf("Decide(hostNetwork pod) = %+v; want served, saying it shares the node's namespace", d)
	}
}

func TestSandboxHandlerPatterns(t *testing.T) {
	r := Rules{SandboxHandlers: []string{"kata*", "exact"}}
	for handler, want := range map[string]bool{"kata": true, "kata-clh": true, "exact": true, "exactly": false, "runc": false, "": false} {
		if got := r.sandbox(handler); got != want {
			t.Errorf("sandbox(%q) = %v, want %v", handler, got, want)
		}
	}
}
