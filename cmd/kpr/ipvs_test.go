package main

import (
	"testing"
)

// kube-proxy's --ipvs-scheduler sets the IPVS mode's scheduler, rr unless
// given, and is no longer among the flags kpr ignores.
func TestIPVSSchedulerFlag(t *testing.T) {
	f, _, ignored, err := parseRun(t, "--proxy-mode=ipvs", "--ipvs-scheduler=sh")
	if err != nil {
		t.Fatal(err)
	}
	if f.fallbackMode != "ipvs" || f.ipvs.scheduler != "sh" {
		t.Errorf("--proxy-mode=ipvs --ipvs-scheduler=sh gives fallback %q scheduler %q, want ipvs and sh", f.fallbackMode, f.ipvs.scheduler)
	}
	if len(ignored.flags) != 0 {
		t.Errorf("kpr says it ignores %q", ignored.flags)
	}
	if f, _, _, err := parseRun(t, "--mode=ipvs"); err != nil || f.ipvs.scheduler != "rr" {
		t.Errorf("without --ipvs-scheduler the scheduler is %q (%v), want rr", f.ipvs.scheduler, err)
	}
}
