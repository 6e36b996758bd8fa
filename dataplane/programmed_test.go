package dataplane

import (
	"maps"
	"slices"
	"testing"
)

// TestAfterApplyAndReconcile checks what a netfilter backend programs and
// rewrites after each call: Apply changes only what it names (a deletion
// of what was never programmed is no change), and Reconcile rewrites
// every ServicePort it is given and deletes every other one programmed.
func TestAfterApplyAndReconcile(t *testing.T) {
	name := func(s string) ServicePortName {
		return ServicePortName{Namespace: "ns", Name: s, Port: "p", Protocol: TCP}
	}
	a, b, c, never := name("a"), name("b"), name("c"), name("never")
	spA, spB, spB2, spC := &ServicePort{Name: a}, &ServicePort{Name: b}, &ServicePort{Name: b}, &ServicePort{Name: c}
	programmed := map[ServicePortName]*ServicePort{a: spA, b: spB}

	next, changed := AfterApply(programmed, map[ServicePortName]*ServicePort{a: nil, b: spB2, c: spC, never: nil})
	if want := map[ServicePortName]*ServicePort{b: spB2, c: spC}; !maps.Equal(next, want) {
		t.Errorf("after Apply: %v, want %v", next, want)
	}
	slices.SortFunc(changed, ServicePortName.Compare)
	if want := []ServicePortName{a, b, c}; !slices.Equal(changed, want) {
		t.Errorf("Apply changed %v, want %v", changed, want)
	}
	if len(programmed) != 2 || programmed[a] != spA || programmed[b] != spB {
		t.Errorf("Apply modified what was programmed: %v", programmed)
	}
	if next, changed := AfterApply(nil, map[ServicePortName]*ServicePort{never: nil}); len(next) != 0 || len(changed) != 0 || next == nil {
		t.Errorf("deleting what was never programmed: %v, changed %v; want an empty map and no change", next, changed)
	}

	next, changed = AfterReconcile(programmed, map[ServicePortName]*ServicePort{b: spB2, c: spC, never: nil})
	if want := map[ServicePortName]*ServicePort{b: spB2, c: spC}; !maps.Equal(next, want) {
		t.Errorf("after Reconcile: %v, want %v", next, want)
	}
	slices.SortFunc(changed, ServicePortName.Compare)
	if want := []ServicePortName{a, b, c}; !slices.Equal(changed, want) {
		t.Errorf("Reconcile touched %v, want %v", changed, want)
	}
}
