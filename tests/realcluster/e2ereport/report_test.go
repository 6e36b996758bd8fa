package e2ereport

import (
	"strings"
	"testing"
)

const sample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4">
  <testsuite name="Kubernetes e2e suite" tests="4">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" status="passed"></testcase>
    <testcase name="[It] [sig-network] Services should be rejected when no endpoints exist" status="failed">
      <failure message="connection was not rejected&#xA;more detail" type="failed"></failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work after restarting kube-proxy [Disruptive]" status="skipped">
      <skipped message="skipped - Only supported for providers [gce gke] (not skeleton)"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

// The table has a row per test of either run (setup nodes left out), a
// column per run, and says why a test failed or was skipped.
func TestTable(t *testing.T) {
	kpr, err := Parse("kpr", strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	passing := strings.NewReplacer(`status="failed"`, `status="passed"`,
		`<failure message="connection was not rejected&#xA;more detail" type="failed"></failure>`, "").Replace(sample)
	ref, err := Parse("kube-proxy", strings.NewReader(passing))
	if err != nil {
		t.Fatal(err)
	}
	delete(ref.Results, "[sig-network] Services should serve a basic endpoint from pods [Conformance]")
	got := Table([]*Run{ref, kpr})
	for _, want := range []string{
		"| test | kube-proxy | kpr |",
		"| [sig-network] Services should be rejected when no endpoints exist | pass | FAIL: connection was not rejected |",
		"| [sig-network] Services should serve a basic endpoint from pods [Conformance] | not run | pass |",
		"| skip: skipped - Only supported for providers [gce gke] (not skeleton) |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "SynchronizedBeforeSuite") {
		t.Errorf("the table lists a setup node:\n%s", got)
	}
}
