// Command realcluster starts and stops the real test cluster (package
// tests/realcluster): make cluster-up and make cluster-down.
//
//	realcluster up -dir bin/cluster      # returns once every node is Ready
//	export KUBECONFIG=$PWD/bin/cluster/kubeconfig
//	realcluster down -dir bin/cluster
//
// up runs the cluster from a background process of its own, which holds the
// VMs and servers until down signals it; its log is DIR/cluster.log.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/tests/realcluster"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dir := fs.String("dir", "bin/cluster", "directory for the kubeconfig, the PID file and the log")
	nodes := fs.Int("nodes", 2, "number of node VMs (up)")
	images := fs.String("images", "", "more image archives for every node, comma separated (up), such as kpr's from make image")
	registry := fs.Bool("registry", false, "serve the images from a registry the nodes pull from, instead of importing them at boot (up); `nginx` is served as the e2e nginx image")
	foreground := fs.Bool("foreground", false, "run the cluster in this process until SIGINT or SIGTERM (up)")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "up":
		if *foreground {
			err = serve(*dir, *nodes, *images, *registry)
		} else {
			err = up(*dir)
		}
	case "down":
		err = down(*dir)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "realcluster:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: realcluster up|down [-dir DIR] [-nodes N] [-images A.tar,B.tar]")
	os.Exit(2)
}

// up starts `up -foreground` in the background, in a session of its own,
// and waits until it has written the kubeconfig (the cluster is up) or
// exited (it failed; its log says why).
func up(dir string) error {
	if pid, err := readPID(dir); err == nil && syscall.Kill(pid, 0) == nil {
		return fmt.Errorf("a cluster is already running from %s (PID %d): realcluster down -dir %s first", dir, pid, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	os.Remove(kubeconfig)
	logPath := filepath.Join(dir, "cluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(os.Args[0], append(os.Args[1:], "-foreground")...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Fprintf(os.Stderr, "realcluster: starting (log: %s)\n", logPath)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("the cluster did not start (%v); see %s", err, logPath)
		case <-time.After(time.Second):
		}
		if _, err := os.Stat(kubeconfig); err == nil {
			fmt.Printf("cluster up: export KUBECONFIG=%s\n", kubeconfig)
			return nil
		}
	}
}

// serve runs the cluster until SIGINT or SIGTERM.
func serve(dir string, nodes int, images string, registry bool) error {
	log, err := zap.NewDevelopment()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := realcluster.Options{Nodes: nodes, Logger: log, Registry: registry}
	if registry {
		// The quick start's `kubectl create deployment web --image=nginx`.
		opts.ImageAliases = []string{"docker.io/library/nginx:latest=registry.k8s.io/e2e-test-images/nginx:1.27.0-2"}
	}
	if images != "" {
		opts.ExtraImages = strings.Split(images, ",")
	}
	c, err := realcluster.Up(ctx, opts)
	if err != nil {
		return err
	}
	kubeconfig, err := os.ReadFile(c.KubeconfigPath)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600)
	}
	if err != nil {
		return errors.Join(err, c.Down())
	}
	<-ctx.Done()
	os.Remove(filepath.Join(dir, "kubeconfig"))
	return c.Down()
}

// down signals the cluster's process and waits until it has exited.
func down(dir string) error {
	pid, err := readPID(dir)
	if err != nil {
		return fmt.Errorf("no cluster recorded in %s: %w", dir, err)
	}
	defer os.Remove(filepath.Join(dir, "pid"))
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			fmt.Println("cluster down")
			return nil
		}
	}
	return fmt.Errorf("the cluster's process %d has not exited 3 minutes after SIGTERM; its log is %s", pid, filepath.Join(dir, "cluster.log"))
}

func readPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
