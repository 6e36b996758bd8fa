package cluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary, re-executed by
// TestServersDieWithTheirStarter, start a cluster and hang.
const helperEnv = "KPR_CLUSTER_TEST_HELPER"

// TestServersDieWithTheirStarter kills a process that started a cluster,
// with SIGKILL so none of its cleanup runs, and checks that the watchdog
// still ends etcd and kube-apiserver and removes the work directory.
func TestServersDieWithTheirStarter(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		startAndHang(t)
		return
	}
	if testing.Short() {
		t.Skip("skipping under -short: starts a real kube-apiserver and etcd in a child")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersDieWithTheirStarter$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	})

	workDir := ""
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if dir, ok := strings.CutPrefix(lines.Text(), "WORKDIR="); ok {
			workDir = dir
			break
		}
	}
	if workDir == "" {
		t.Fatal("helper process exited without starting a cluster")
	}
	pids := controlPlanePIDs(&Cluster{workDir: workDir})
	if len(pids) != 2 {
		t.Fatalf("found control-plane processes %v for %s, want etcd and kube-apiserver", pids, workDir)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()

	deadline := time.Now().Add(15 * time.Second)
	for {
		alive := []int{}
		for _, pid := range pids {
			if processAlive(pid) {
				alive = append(alive, pid)
			}
		}
		_, statErr := os.Stat(workDir)
		if len(alive) == 0 && os.IsNotExist(statErr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after killing the starter: processes %v still alive, work dir stat: %v", alive, statErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startAndHang(t *testing.T) {
	c := StartForTest(t, Options{})
	fmt.Printf("WORKDIR=%s\n", c.workDir)
	time.Sleep(time.Hour) // until the parent kills us
}
