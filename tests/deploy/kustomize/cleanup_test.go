package kustomize

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kpr-io/kpr/tests/deploy"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// TestCleanupWaitsForKpr runs the cleanup DaemonSet's init container
// command, as the container runtime would, with the real `kpr status`
// and a stand-in for kpr's daemon on the metrics address of the base's
// configuration: `kpr cleanup` must not run while that daemon answers,
// and must run, with the manifest's arguments, once it is gone. The
// stand-in `kpr cleanup` only records its arguments: the real one would
// remove this machine's kpr dataplane.
func TestCleanupWaitsForKpr(t *testing.T) {
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

	// The daemon the script waits for listens where the base's
	// configuration has kpr serve its metrics; the test's stand-in
	// listens elsewhere, so the script's address is swapped for it (and
	// kpr status reads pins from an empty directory, not the host's).
	metrics := baseMetricsAddress(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	daemon := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/kpr/status" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"version":"test","pid":%d,"mode":"ebpf"}`, os.Getpid())
	})}
	go daemon.Serve(l) //nolint:errcheck // ends with Close below
	defer daemon.Close()
	flag := "--metrics-address=" + metrics
	if n := strings.Count(command[2], flag); n != 1 {
		t.Fatalf("the cleanup script names %s %d times, want once: it must wait on the base's metrics address\n%s", flag, n, command[2])
	}
	script := strings.Replace(command[2], flag, "--metrics-address="+l.Addr().String()+" --bpf-root="+t.TempDir(), 1)

	kpr, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	bin, ran := t.TempDir(), filepath.Join(t.TempDir(), "cleanup-args")
	wrapper := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = cleanup ]; then shift; echo \"$@\" > %q; exit 0; fi\nexec %q \"$@\"\n", ran, kpr)
	if err := os.WriteFile(filepath.Join(bin, "kpr"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(command[0], append([]string{command[1], script, command[3]}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() //nolint:errcheck // the test failed already
			<-exited
		}
	}()

	// The script's poll interval is 5 s: two polls at least.
	select {
	case err := <-exited:
		t.Fatalf("the cleanup script ended (%v) while kpr's daemon answered:\n%s", err, out.String())
	case <-time.After(7 * time.Second):
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("kpr cleanup ran while kpr's daemon answered (%v):\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "kpr still runs on this node") {
		t.Errorf("the script did not say what it waits for:\n%s", out.String())
	}

	daemon.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the cleanup script: %v\n%s", err, out.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the cleanup script still waits 15 s after kpr's daemon went:\n%s", out.String())
	}
	got, err := os.ReadFile(ran)
	if err != nil {
		t.Fatalf("kpr cleanup did not run: %v\n%s", err, out.String())
	}
	if want := strings.Join(args, " ") + "\n"; string(got) != want {
		t.Errorf("kpr cleanup ran with %q, want the manifest's args %q", got, want)
	}
}

// baseMetricsAddress is the metrics address of deploy/base's
// configuration, as kpr serves it.
func baseMetricsAddress(t *testing.T) string {
	t.Helper()
	objs, err := deploy.Parse(render(t, deploy.BaseDir()))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetName() != "kpr-config" {
			continue
		}
		conf, _, _ := unstructured.NestedString(o.Object, "data", "config.conf")
		var cfg struct {
			MetricsBindAddress string `json:"metricsBindAddress"`
		}
		if err := yaml.Unmarshal([]byte(conf), &cfg); err != nil || cfg.MetricsBindAddress == "" {
			t.Fatalf("kpr-config's config.conf has no metricsBindAddress (%v):\n%s", err, conf)
		}
		return cfg.MetricsBindAddress
	}
	t.Fatal("deploy/base has no ConfigMap kpr-config")
	return ""
}
