package kustomize

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kpr-io/kpr/tests/deploy"
)

// TestCleanupWaitsForKpr runs the cleanup DaemonSet's init container
// command as the container runtime would, unchanged, in a PID namespace
// of its own (as the Pod's hostPID shows it the node's processes), beside
// a stand-in for kpr's daemon: a process named kpr, which serves no
// metrics or health address at all, as a kpr run with both disabled.
// `kpr cleanup` must not run while it lives, and must run, with the
// manifest's arguments, once it is gone. The `kpr cleanup` the script
// finds on its PATH only records its arguments: the real one would remove
// this machine's kpr dataplane.
func TestCleanupWaitsForKpr(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, for a PID namespace of its own (unshare --pid --mount-proc)")
	}
	objs, err := deploy.Parse(render(t, deploy.CleanupDir()))
	if err != nil || len(objs) != 1 {
		t.Fatalf("deploy/cleanup: %d objects, %v", len(objs), err)
	}
	var command, args []string
	for _, c := range objectsAt(objs[0].Object, "spec", "template", "spec", "initContainers") {
		if c["name"] == "cleanup" {
			command, _, _ = unstructured.NestedStringSlice(c, "command")
			args, _, _ = unstructured.NestedStringSlice(c, "args")
		}
	}
	if len(command) != 4 || command[0] != "/bin/sh" || command[1] != "-c" {
		t.Fatalf("cleanup command %q, want /bin/sh -c SCRIPT NAME", command)
	}
	if hostPID, _, _ := unstructured.NestedBool(objs[0].Object, "spec", "template", "spec", "hostPID"); !hostPID {
		t.Error("the cleanup Pod lacks hostPID: its wait would see only its own processes, never kpr")
	}

	dir := t.TempDir()
	started, stop, ran := filepath.Join(dir, "started"), filepath.Join(dir, "stop"), filepath.Join(dir, "cleanup-args")
	// The stand-in: a script named kpr, which the kernel names kpr too
	// (/proc/PID/comm) from its start on, living until the test stops it.
	standIn := filepath.Join(dir, "daemon", "kpr")
	recorder := filepath.Join(dir, "bin", "kpr")
	for path, script := range map[string]string{
		standIn:  fmt.Sprintf("#!/bin/sh\n: > %q\nwhile [ ! -e %q ]; do sleep 0.2; done\n", started, stop),
		recorder: fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = cleanup ]; then shift; echo \"$@\" > %q; exit 0; fi\nexit 1\n", ran),
		// PID 1 of the namespace: starts the stand-in and, once it runs
		// (as kpr would long before a cleanup), the script as the
		// runtime would; it reaps the stand-in once that ends, as its
		// own parent would on a node.
		filepath.Join(dir, "init"): "#!/bin/sh\n\"$KPR_STANDIN\" &\nwhile [ ! -e \"$KPR_STARTED\" ]; do sleep 0.1; done\n" +
			"/bin/sh -c \"$KPR_SCRIPT\" \"$@\"\nrc=$?\nwait\nexit $rc\n",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("unshare", append([]string{"--pid", "--fork", "--mount-proc", filepath.Join(dir, "init"), command[3]}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(recorder)+":"+os.Getenv("PATH"), "KPR_STANDIN="+standIn, "KPR_STARTED="+started, "KPR_SCRIPT="+command[2])
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			os.WriteFile(stop, nil, 0o644) //nolint:errcheck // ends the stand-in
			cmd.Process.Kill()             //nolint:errcheck // the test failed already
			<-exited
		}
	}()

	// The script's poll interval is 5 s: two polls at least.
	select {
	case err := <-exited:
		t.Fatalf("the cleanup script ended (%v) while a kpr ran:\n%s", err, out.String())
	case <-time.After(7 * time.Second):
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("kpr cleanup ran while a kpr ran (%v):\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "kpr still runs on this node (pid ") {
		t.Errorf("the script did not say what it waits for:\n%s", out.String())
	}

	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the cleanup script: %v\n%s", err, out.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the cleanup script still waits 15 s after kpr ended:\n%s", out.String())
	}
	got, err := os.ReadFile(ran)
	if err != nil {
		t.Fatalf("kpr cleanup did not run: %v\n%s", err, out.String())
	}
	if want := strings.Join(args, " ") + "\n"; string(got) != want {
		t.Errorf("kpr cleanup ran with %q, want the manifest's args %q", got, want)
	}
}
