package main

import (
	"strings"
	"testing"
)

// A console as a VM prints it: kernel noise, the init's framed lines and
// -test.v output with subtests, a skip and a failure.
const console = `[    0.01] Linux version 5.10.0
@@kpr modules veth,bridge
@@kpr kernel 5.10.0-32-amd64
@@kpr probe { "kernel": "5.10.0-32-amd64", "features": [ { "name": "bpf_set_retval helper", "supported": false, "error": "x" } ], "modeAuto": { "backend": "ebpf" } }
@@kpr suite socklb
=== RUN   TestA
=== RUN   TestA/IPv4
--- PASS: TestA (0.10s)
    --- PASS: TestA/IPv4 (0.05s)
=== RUN   TestB
    sockterm_test.go:31: kernel 5.10 cannot destroy UDP sockets
--- SKIP: TestB (0.00s)
=== RUN   TestC
    c_test.go:9: boom
--- FAIL: TestC (0.20s)
FAIL
@@kpr end socklb 1 3.5s
@@kpr done 
[    9.00] reboot: Power down
`

func TestParseCountsTopLevelTestsAndSkipReasons(t *testing.T) {
	r := &result{suite: "bullseye"}
	r.parse([]byte(console))
	if !r.done || r.release != "5.10.0-32-amd64" || r.modules != "veth,bridge" {
		t.Fatalf("framing: done=%v release=%q modules=%q", r.done, r.release, r.modules)
	}
	if r.probe == nil || len(r.probe.Features) != 1 || r.probe.Features[0].Supported {
		t.Fatalf("probe = %+v", r.probe)
	}
	if len(r.suites) != 1 {
		t.Fatalf("suites = %d", len(r.suites))
	}
	s := r.suites[0]
	if !s.ended || s.exit != 1 || len(s.passed) != 1 || len(s.failed) != 1 || len(s.skipped) != 1 {
		t.Fatalf("suite = %+v", s)
	}
	if s.skipped[0].name != "TestB" || s.skipped[0].reason != "kernel 5.10 cannot destroy UDP sockets" {
		t.Fatalf("skip = %+v", s.skipped[0])
	}
	if r.ok() {
		t.Fatal("a run with a failure is ok")
	}
	doc := markdown([]*result{r}, "-kernels bullseye")
	for _, want := range []string{"| bpf_set_retval helper | no |", "| `--mode auto` picks | ebpf |", "| tests/socklb passed / failed / skipped | 1 / 1 / 1 |", "- FAIL TestC", "- skip TestB: kernel 5.10 cannot destroy UDP sockets"} {
		if !strings.Contains(doc, want) {
			t.Errorf("summary lacks %q:\n%s", want, doc)
		}
	}
}
