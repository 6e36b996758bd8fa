package realcluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/realcluster/docblocks"
)

// The README's sh blocks, found by what they show rather than by their
// order, so that a new block elsewhere in the page does not shift them.
const (
	// readmeQuickStartMark is in the quick start for a real cluster.
	readmeQuickStartMark = "helm install kpr"
	// readmeCLIMark is in the tour of the CLI.
	readmeCLIMark = "bin/kpr probe"
)

// readmeBlock returns the README's sh block that contains mark.
func readmeBlock(t *testing.T, mark string) docblocks.Block {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docblocks.Read(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if strings.Contains(b.Script, mark) {
			return b
		}
	}
	t.Fatalf("README.md has no sh block with %q", mark)
	return docblocks.Block{}
}

// runReadmeQuickStart runs the README's quick start on c, word for word but
// for its placeholders: the API server's address (10.0.0.10:6443) and the
// NodePort it curls (NODE_IP:NODE_PORT), which becomes nodePort on the
// first node. It checks what the block's comments promise: kpr status
// reports the eBPF mode, and the NodePort answers.
func runReadmeQuickStart(ctx context.Context, t *testing.T, c *Cluster, nodePort int32) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b := readmeBlock(t, readmeQuickStartMark)
	script := strings.NewReplacer(
		"apiServer.host=10.0.0.10", "apiServer.host="+controlPlane.String(),
		"apiServer.port=6443", "apiServer.port="+c.APIServerPort(),
		"NODE_IP:NODE_PORT", fmt.Sprintf("%s:%d", c.nodes[0].address, nodePort)).Replace(b.Script)
	out, err := c.runShell(ctx, root, script)
	t.Logf("README.md:%d:\n%s\n%s", b.Line, script, out)
	if err != nil {
		t.Fatalf("README.md:%d: %v", b.Line, err)
	}
	if !regexp.MustCompile(`(?m)^mode:\s+ebpf\b`).MatchString(out) {
		t.Errorf("README.md:%d: kpr status does not report the eBPF mode", b.Line)
	}
	// The block ends with the curl; its answer is the output's last line.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "NOW:") {
		t.Errorf("README.md:%d: the NodePort's answer is %q, want agnhost netexec's %q", b.Line, last, "NOW: <time>")
	}
}

// runReadmeCLI runs each kpr command of the README's CLI tour where a user
// runs it: on a node, here in the kpr pod of c's first node (it shares the
// node's network, bpffs and cgroups; "sudo bin/" goes). The tour's explain
// and trace name default/web, which the caller has created. kpr cleanup,
// which ends kpr's Service translation on the node, runs last.
func runReadmeCLI(ctx context.Context, t *testing.T, c *Cluster) {
	t.Helper()
	b := readmeBlock(t, readmeCLIMark)
	pods, err := c.Client.CoreV1().Pods("kpr-system").List(ctx, metav1.ListOptions{
		LabelSelector: "k8s-app=kpr", FieldSelector: "spec.nodeName=" + c.nodes[0].name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the kpr pod on %s: %d pods, %v", c.nodes[0].name, len(pods.Items), err)
	}
	pod := pods.Items[0]
	var cleanups []string
	for i, line := range strings.Split(b.Script, "\n") {
		command, _, _ := strings.Cut(line, " #")
		command = strings.TrimSpace(command)
		where := fmt.Sprintf("README.md:%d: %s", b.Line+1+i, command)
		switch {
		case command == "":
		case strings.HasPrefix(command, "make "):
			// TestReadmeMakeTargets checks these, on every make test.
		case strings.HasPrefix(command, "sudo bin/kpr run "):
			// The DaemonSet's container is this command.
			if args := pod.Spec.Containers[0].Args; len(args) == 0 || args[0] != "run" {
				t.Errorf("%s: the kpr pod runs %q, not kpr run", where, args)
			}
		case strings.HasPrefix(command, "sudo bpftool map dump "):
			// kpr's image carries bpftool; the dump shows BTF's field names.
			out, err := c.Run(ctx, "kubectl", "-n", "kpr-system", "exec", pod.Name, "--", "sh", "-c", strings.TrimPrefix(command, "sudo "))
			t.Logf("%s:\n%s", where, out)
			if err != nil || !strings.Contains(out, `"key": {`) {
				t.Errorf("%s: %v; want entries with BTF's field names", where, err)
			}
		case strings.HasPrefix(command, "sudo bin/kpr cleanup") && !strings.Contains(command, "--kube-proxy"):
			cleanups = append(cleanups, command)
		case strings.HasPrefix(command, "sudo bin/kpr trace "):
			runReadmeTrace(ctx, t, c, pod.Name, where, strings.TrimPrefix(command, "sudo bin/"))
		case strings.HasPrefix(command, "sudo bin/kpr "):
			out, err := c.Run(ctx, "kubectl", "-n", "kpr-system", "exec", pod.Name, "--", "sh", "-c", strings.TrimPrefix(command, "sudo bin/"))
			t.Logf("%s:\n%s", where, out)
			if err != nil {
				t.Errorf("%s: %v", where, err)
			}
		default:
			t.Errorf("%s: the test does not know where to run this; teach runReadmeCLI", where)
		}
	}
	for _, command := range cleanups {
		out, err := c.Run(ctx, "kubectl", "-n", "kpr-system", "exec", pod.Name, "--", "sh", "-c", strings.TrimPrefix(command, "sudo bin/"))
		t.Logf("README.md: %s:\n%s", command, out)
		if err != nil || strings.Contains(out, "nothing to remove") {
			t.Errorf("README.md: %s on a node kpr serves: %v, want it to remove kpr's state", command, err)
		}
	}
}

// runReadmeTrace runs the tour's kpr trace in the kpr pod with --count 1
// (the tour's trace runs until Ctrl-C, which kubectl exec cannot send to
// the container), while a pod on the same node connects to the traced
// Service, and checks that the trace shows the translation.
func runReadmeTrace(ctx context.Context, t *testing.T, c *Cluster, kprPod, where, command string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	type result struct {
		out string
		err error
	}
	traced := make(chan result, 1)
	go func() {
		out, err := c.Run(ctx, "kubectl", "-n", "kpr-system", "exec", kprPod, "--", "sh", "-c", command+" --count 1")
		traced <- result{out, err}
	}()
	// The trace starts before the client's connect(): the client's pod
	// takes seconds to start, and it retries until the trace has its event.
	overrides := fmt.Sprintf(`{"spec":{"nodeName":%q}}`, c.nodes[0].name)
	if _, err := c.Run(ctx, "kubectl", "run", "trace-client", "--restart=Never", "--overrides="+overrides,
		"--image=registry.k8s.io/e2e-test-images/busybox:1.37.0-2", "--",
		"sh", "-c", "for i in $(seq 60); do wget -q -O- -T 2 http://web.default/hostname; echo; sleep 2; done"); err != nil {
		t.Errorf("%s: starting a client: %v", where, err)
		return
	}
	defer c.Run(context.Background(), "kubectl", "delete", "pod", "trace-client", "--now")
	r := <-traced
	t.Logf("%s --count 1:\n%s", where, r.out)
	if r.err != nil || !strings.Contains(r.out, "translated") {
		t.Errorf("%s --count 1: %v; want a translated connect from the client pod", where, r.err)
	}
}

// TestReadmeMakeTargets: every make command in the README's sh blocks names
// a target make knows, with a recipe that expands (make -n). The targets
// themselves run elsewhere: make test is CI, make demo is TestDemo, the
// cluster's in their own make targets.
func TestReadmeMakeTargets(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docblocks.Read(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, b := range blocks {
		for i, line := range strings.Split(b.Script, "\n") {
			command, _, _ := strings.Cut(line, " #")
			fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(command), "sudo "))
			if len(fields) < 2 || fields[0] != "make" {
				continue
			}
			cmd := exec.Command("make", append([]string{"-n"}, fields[1:]...)...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("README.md:%d: %s: make -n: %v\n%s", b.Line+1+i, strings.Join(fields, " "), err, out)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("README.md shows no make command; did the sh blocks change fence?")
	}
}
