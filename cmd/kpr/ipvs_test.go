package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// kube-proxy's --ipvs-scheduler sets the IPVS mode's scheduler, rr unless
// given, and is no longer among the flags kpr ignores.
func TestIPVSSchedulerFlag(t *testing.T) {
	f, _, ignored, err := parseRun(t, "--proxy-mode=ipvs", "--ipvs-scheduler=sh")
	if err != nil {
		t.Fatal(err)
	}
	if f.mode != "ipvs" || f.ipvs.scheduler != "sh" {
		t.Errorf("--proxy-mode=ipvs --ipvs-scheduler=sh gives mode %q scheduler %q, want ipvs and sh", f.mode, f.ipvs.scheduler)
	}
	if len(ignored.flags) != 0 {
		t.Errorf("kpr says it ignores %q", ignored.flags)
	}
	if f, _, _, err := parseRun(t, "--mode=ipvs"); err != nil || f.ipvs.scheduler != "rr" {
		t.Errorf("without --ipvs-scheduler the scheduler is %q (%v), want rr", f.ipvs.scheduler, err)
	}
}

// The IPVS mode's record of the namespace it wrote is its own, beside the
// iptables mode's: removing one mode's state never reads the other's
// record.
func TestIPVSRecordIsApartFromIPTables(t *testing.T) {
	root := t.TempDir() + "/bpf"
	ipt, err := iptablesMarker(root, "")
	if err != nil {
		t.Fatal(err)
	}
	v, err := modeMarker(root, "", ipvsMarkerKind)
	if err != nil {
		t.Fatal(err)
	}
	if v == ipt || !strings.Contains(v, "-ipvs-netns-") || strings.Contains(filepath.Base(v), ".") {
		t.Errorf("IPVS record %s, iptables record %s: want distinct, the IPVS one naming ipvs and without dots (bpffs)", v, ipt)
	}
	if err := recordModeState(root, "", ipvsMarkerKind); err != nil {
		t.Fatal(err)
	}
	if _, found, err := removeIPTablesState(root, ""); found || err != nil {
		t.Errorf("the IPVS record was taken for the iptables mode's (found %v, %v)", found, err)
	}
}
