package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/namedns"
)

// TestDemo runs `make demo`'s program, as the README tells a newcomer to:
// it must end on its own with exit 0, show requests to the ClusterIP
// answered by all three pods and kpr dump's table, and leave neither its
// node's network namespace nor its bpffs directory behind.
func TestDemo(t *testing.T) {
	harness.RequireRoot(t)
	var out, errOut bytes.Buffer
	code := run(&out, &errOut)
	t.Logf("make demo's output:\n%s%s", out.String(), errOut.String())
	if code != 0 {
		t.Fatalf("the demo exited %d, want 0", code)
	}
	text := out.String()
	balancing := regexp.MustCompile(`GET http://\S+ from the node: \d+ answers: (.*)`).FindStringSubmatch(text)
	if balancing == nil || strings.Count(balancing[1], "web-") != 3 {
		t.Errorf("the demo does not show three pods answering the ClusterIP: %q", balancing)
	}
	for _, want := range []string{"kpr dump: ", "teardown: kpr stopped and `kpr cleanup` run", "done in "} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	node := regexp.MustCompile(`node: netns (\S+),`).FindStringSubmatch(text)
	if node == nil {
		t.Fatal("the demo does not name its node's network namespace")
	}
	if _, err := os.Stat(namedns.Path(node[1])); !os.IsNotExist(err) {
		t.Errorf("the demo's node namespace %s is still there (%v)", node[1], err)
	}
	if left, _ := filepath.Glob("/sys/fs/bpf/kpr-demo-*"); len(left) > 0 {
		t.Errorf("the demo left bpffs directories: %v", left)
	}
}
