package cgroupprocs

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

func TestPIDsWalksTheTree(t *testing.T) {
	root := t.TempDir()
	write := func(rel, procs string) {
		dir := filepath.Join(root, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(procs), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".", "1\n2\n")
	write("kubepods/pod-a", "10\n0\n11\n") // 0: a process outside our PID namespace
	write("kubepods/pod-b", "")
	if err := os.MkdirAll(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	pids, err := PIDs(root)
	if err != nil {
		t.Fatal(err)
	}
	sort.Ints(pids)
	if want := []int{1, 2, 10, 11}; !reflect.DeepEqual(pids, want) {
		t.Fatalf("pids %v, want %v", pids, want)
	}
}
