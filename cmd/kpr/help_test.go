package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// `kpr run --help` lists kpr's own flags, then kube-proxy's under a heading
// of their own, each saying what kpr does with it; and no usage text
// trips pflag's backquote rule (which would print `--fallback-mode kpr
// probe` for a value name).
func TestRunHelpHeadings(t *testing.T) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"run", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	own, kube, ok := strings.Cut(help, "kube-proxy's flags")
	if !ok {
		t.Fatalf("no kube-proxy heading:\n%s", help)
	}
	for _, f := range []string{"--mode ", "--sync-period ", "--devices ", "--map-size-conntrack "} {
		if !strings.Contains(own, f) {
			t.Errorf("kpr's flag %s is not under Flags", f)
		}
	}
	flagLine := regexp.MustCompile(`^\s+(?:-\w, )?--([\w-]+)(?: (\S+))?\s{2,}(.*)$`)
	valueNames := map[string]bool{"string": true, "strings": true, "duration": true, "int": true, "int32": true, "uint32": true, "float32": true, "version[=true]": true}
	kubeFlags := 0
	for _, line := range strings.Split(help, "\n") {
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[2] != "" && !valueNames[m[2]] {
			t.Errorf("--%s shows the value name %q (a backquoted word in its usage?)", m[1], m[2])
		}
	}
	kube, _, _ = strings.Cut(kube, "Global Flags:")
	for _, line := range strings.Split(kube, "\n") {
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		kubeFlags++
		if !regexp.MustCompile(`^\[(honoured|mapped|ignored|refused)\] `).MatchString(m[3]) {
			t.Errorf("kube-proxy's --%s does not say what kpr does with it: %q", m[1], m[3])
		}
	}
	for _, f := range []string{"proxy-mode", "config", "hostname-override", "conntrack-max-per-core", "detect-local-mode", "write-config-to"} {
		if !strings.Contains(kube, "--"+f+" ") {
			t.Errorf("kube-proxy's --%s is not under its heading", f)
		}
	}
	if kubeFlags < 40 {
		t.Errorf("%d kube-proxy flags under the heading, want kube-proxy's (about 55)", kubeFlags)
	}
}
