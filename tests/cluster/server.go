package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// server is one control-plane process, etcd or kube-apiserver, run through
// its launcher (see writeLauncher) with stdout and stderr appended to a log
// file. It can be started again after stop with the same arguments.
type server struct {
	name     string // the binary's name: etcd or kube-apiserver
	launcher string
	args     []string
	logPath  string
	pidFile  string // written by the launcher

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited and been reaped
	err    error         // cmd.Wait's result, set before exited closes
}

// start runs the server and polls ready until it succeeds. It gives up as
// soon as the process exits (a lost port race ends it at once), after
// startTimeout, or when ctx ends; the caller then stops it.
func (s *server) start(ctx context.Context, ready func(context.Context) error) error {
	if s.cmd != nil {
		return fmt.Errorf("%s was started and not stopped", s.name)
	}
	log, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the %s log: %w", s.name, err)
	}
	// The child keeps its own copy of the descriptor.
	defer log.Close()
	cmd := exec.Command(s.launcher, s.args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C at the terminal reaches only the
	// process that started the server, which stops it in order (and the
	// watchdog covers a starter that dies).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%s exited before it was ready: %v", s.name, s.err)
		case <-ctx.Done():
			return fmt.Errorf("%s is not ready: %w (last error: %v)", s.name, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM, and SIGKILL if the server is still running
// stopTimeout later, then removes its PID file: the PID may be reused from
// then on, and the watchdog must not kill whatever gets it. A server that
// was never started or has already exited is no error.
func (s *server) stop() error {
	if s == nil || s.cmd == nil {
		return nil
	}
	var err error
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			_ = s.cmd.Process.Kill()
			<-s.exited
			err = fmt.Errorf("%s did not stop within %v of SIGTERM and was killed", s.name, stopTimeout)
		}
	}
	s.cmd = nil
	if rmErr := os.Remove(s.pidFile); rmErr != nil && !os.IsNotExist(rmErr) {
		err = fmt.Errorf("removing the %s PID file: %w", s.name, rmErr)
	}
	return err
}

// httpOK is a readiness check that GETs url and wants 200 OK.
func httpOK(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		// No idle connection kept to a server that may be stopped.
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// freePorts returns n different TCP ports of 127.0.0.1 that were free a
// moment ago: all are bound at once (so they differ) and then released for
// the servers to bind. Another process may take one in between; Start
// retries with new ports when that happens.
func freePorts(n int) ([]string, error) {
	var ports []string
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		listeners = append(listeners, l)
		_, port, _ := net.SplitHostPort(l.Addr().String())
		ports = append(ports, port)
	}
	return ports, nil
}
