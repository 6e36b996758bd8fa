package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// DefaultServiceClusterIPRange is the dual-stack Service CIDR pair the API
// server allocates ClusterIPs from unless Options say otherwise.
const DefaultServiceClusterIPRange = "10.96.0.0/16,fd00:96::/112"

// startTimeout bounds each process start. A first API server start on a busy
// 2-core machine takes several seconds; envtest's default of 20s is too tight
// when tests run in parallel with builds.
const startTimeout = 90 * time.Second

// Options configure a test cluster. The zero value is a loopback-only
// cluster with the default dual-stack Service CIDRs.
type Options struct {
	// ServiceClusterIPRange is passed as --service-cluster-ip-range;
	// default DefaultServiceClusterIPRange.
	ServiceClusterIPRange string

	// ToolsDir holds kube-apiserver and etcd. Default: $KPR_TOOLS_DIR, else
	// the directory hack/tools.sh builds (and prints).
	ToolsDir string

	// NetNS, if set, names a network namespace (/run/netns/NAME) to run
	// etcd and the API server in. Its lo is set up; both servers listen on
	// 127.0.0.1 inside it and the API server also on all its addresses.
	// The same ports are relayed from 127.0.0.1 on the host, so
	// Config, Client and KubeconfigPath work from either side.
	NetNS string

	// AdvertiseAddress is the API server's --advertise-address (the
	// address the default "kubernetes" Service points at). Required with
	// NetNS, where it must be an address inside that namespace; optional
	// otherwise.
	AdvertiseAddress string

	// APIServerArgs are extra kube-apiserver flags (name without "--" to
	// value); they override the defaults set here.
	APIServerArgs map[string]string

	// Logger receives progress messages; default a no-op logger.
	Logger *zap.Logger

	// BuildLog receives hack/tools.sh's progress if the tools have to be
	// built; default os.Stderr.
	BuildLog io.Writer
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// Config reaches the API server as a member of system:masters.
	Config *rest.Config
	// Client is a clientset built from Config.
	Client kubernetes.Interface
	// KubeconfigPath is a kubeconfig file with the same admin credentials,
	// for other processes. It is removed by Stop.
	KubeconfigPath string

	env        *envtest.Environment
	workDir    string
	logFiles   []*os.File
	forwarders []*netnsForwarder
	watchdog   *watchdog
	log        *zap.Logger

	mu      sync.Mutex
	stopped bool
}

// Start starts etcd and the API server and waits until the API server serves
// the default namespace. On error nothing is left running.
func Start(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if opts.NetNS != "" && opts.AdvertiseAddress == "" {
		return nil, errors.New("cluster: Options.NetNS needs Options.AdvertiseAddress, an address inside that namespace (kube-apiserver refuses to advertise loopback)")
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	buildLog := opts.BuildLog
	if buildLog == nil {
		buildLog = os.Stderr
	}
	toolsDir, err := resolveToolsDir(opts.ToolsDir, buildLog)
	if err != nil {
		return nil, err
	}

	workDir, err := os.MkdirTemp("", "kpr-testcluster-")
	if err != nil {
		return nil, fmt.Errorf("creating the cluster's work directory: %w", err)
	}
	c := &Cluster{workDir: workDir, log: log}
	if c.watchdog, err = startWatchdog(workDir); err != nil {
		os.RemoveAll(workDir)
		return nil, err
	}
	defer func() {
		if retErr != nil {
			if err := c.Stop(); err != nil {
				retErr = errors.Join(retErr, err)
			}
		}
	}()

	began := time.Now()
	env, err := c.startEnvironment(ctx, toolsDir, opts)
	if err != nil {
		return nil, err
	}

	c.Config = env.Config
	if c.Client, err = kubernetes.NewForConfig(env.Config); err != nil {
		return nil, fmt.Errorf("building a clientset for the test API server: %w", err)
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("test API server is not ready: %w%s", err, c.logTails())
	}
	c.KubeconfigPath = filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, env.KubeConfig, 0o600); err != nil {
		return nil, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	log.Info("test cluster started",
		zap.String("apiserver", env.Config.Host),
		zap.String("kubeconfig", c.KubeconfigPath),
		zap.String("netns", opts.NetNS),
		zap.Duration("took", time.Since(began)))
	return c, nil
}

// maxStartAttempts bounds retries of a start that lost a port race.
const maxStartAttempts = 3

// startEnvironment starts etcd and the API server. envtest picks free ports
// by binding and releasing them, so another cluster starting at the same
// time (parallel test packages do) can take one first; envtest's own retries
// reuse the taken port, so such a start is retried here with new ports.
func (c *Cluster) startEnvironment(ctx context.Context, toolsDir string, opts Options) (*envtest.Environment, error) {
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		env, err := c.newEnvironment(toolsDir, opts)
		if err != nil {
			return nil, err
		}
		// envtest's Start takes no context; it is bounded by
		// startTimeout per process instead.
		_, err = env.Start()
		if err == nil {
			c.env = env
			return env, nil
		}
		logs := c.logTails()
		if stopErr := env.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if attempt < maxStartAttempts && strings.Contains(logs, "address already in use") {
			c.log.Warn("test control plane lost a port race; retrying with new ports", zap.Int("attempt", attempt), zap.Error(err))
			continue
		}
		return nil, fmt.Errorf("starting etcd and kube-apiserver from %s: %w%s", toolsDir, err, logs)
	}
}

// resetAttempt clears what a failed start attempt left: its directories,
// logs and forwarders.
func (c *Cluster) resetAttempt() error {
	for _, f := range c.forwarders {
		f.Close()
	}
	c.forwarders = nil
	for _, f := range c.logFiles {
		f.Close()
	}
	c.logFiles = nil
	for _, dir := range []string{"apiserver", "etcd", "bin"} {
		if err := os.RemoveAll(filepath.Join(c.workDir, dir)); err != nil {
			return fmt.Errorf("clearing %s: %w", dir, err)
		}
	}
	return nil
}

// newEnvironment configures envtest: fixed binaries, fixed directories (so
// certificates and data survive an API server restart), dual-stack service
// CIDRs, launcher scripts (PID files for the watchdog; netns entry) and, in
// NetNS mode, forwarded ports.
func (c *Cluster) newEnvironment(toolsDir string, opts Options) (*envtest.Environment, error) {
	if err := c.resetAttempt(); err != nil {
		return nil, err
	}
	// Setting CertDir and DataDir ourselves stops envtest from deleting
	// and regenerating them when the API server is stopped, so a restart
	// serves the same CA and accepts the same client certificates.
	certDir := filepath.Join(c.workDir, "apiserver")
	dataDir := filepath.Join(c.workDir, "etcd")
	binDir := filepath.Join(c.workDir, "bin")
	for _, dir := range []string{certDir, dataDir, binDir} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	apiServerPath, err := writeLauncher(binDir, apiServerBinary, filepath.Join(toolsDir, apiServerBinary), opts.NetNS)
	if err != nil {
		return nil, err
	}
	etcdPath, err := writeLauncher(binDir, etcdBinary, filepath.Join(toolsDir, etcdBinary), opts.NetNS)
	if err != nil {
		return nil, err
	}
	apiLog, err := c.openLog("kube-apiserver.log")
	if err != nil {
		return nil, err
	}
	etcdLog, err := c.openLog("etcd.log")
	if err != nil {
		return nil, err
	}

	apiServer := &envtest.APIServer{
		Path:         apiServerPath,
		CertDir:      certDir,
		StartTimeout: startTimeout,
		StopTimeout:  startTimeout,
		Out:          apiLog,
		Err:          apiLog,
	}
	etcd := &envtest.Etcd{
		Path:         etcdPath,
		DataDir:      dataDir,
		StartTimeout: startTimeout,
		StopTimeout:  startTimeout,
		Out:          etcdLog,
		Err:          etcdLog,
	}

	args := apiServer.Configure()
	serviceRange := opts.ServiceClusterIPRange
	if serviceRange == "" {
		serviceRange = DefaultServiceClusterIPRange
	}
	args.Set("service-cluster-ip-range", serviceRange)
	if opts.AdvertiseAddress != "" {
		args.Set("advertise-address", opts.AdvertiseAddress)
	}

	if opts.NetNS != "" {
		if err := c.placeInNetNS(opts, apiServer, etcd); err != nil {
			return nil, err
		}
	}
	for name, value := range opts.APIServerArgs {
		args.Set(name, value)
	}

	useExisting := false
	return &envtest.Environment{
		ControlPlane: envtest.ControlPlane{APIServer: apiServer, Etcd: etcd},
		// Never reach for a cluster named by the environment, and never
		// download: the binaries above are the only ones used.
		UseExistingCluster:       &useExisting,
		DownloadBinaryAssets:     false,
		BinaryAssetsDirectory:    toolsDir,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  startTimeout,
	}, nil
}

// placeInNetNS prepares opts.NetNS for etcd and the API server (whose
// launchers enter it) and relays their ports to the host loopback (see
// netnsForwarder).
func (c *Cluster) placeInNetNS(opts Options, apiServer *envtest.APIServer, etcd *envtest.Etcd) error {
	if err := bringUpLoopback(opts.NetNS); err != nil {
		return err
	}
	etcdFwd, err := newNetNSForwarder(opts.NetNS, c.log)
	if err != nil {
		return err
	}
	c.forwarders = append(c.forwarders, etcdFwd)
	apiFwd, err := newNetNSForwarder(opts.NetNS, c.log)
	if err != nil {
		return err
	}
	c.forwarders = append(c.forwarders, apiFwd)

	etcd.URL = &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", etcdFwd.port)}
	apiServer.SecureServing.ListenAddr = envtest.ListenAddr{Address: "127.0.0.1", Port: apiFwd.port}
	// Listen on every address of the namespace, so clients inside it can
	// also use the advertised address (the "kubernetes" Service's
	// endpoint); the serving certificate names only localhost and
	// 127.0.0.1, so such clients need tls-server-name: localhost.
	bind := "0.0.0.0"
	if ip := net.ParseIP(opts.AdvertiseAddress); ip != nil && ip.To4() == nil {
		bind = "::"
	}
	apiServer.Configure().Set("bind-address", bind)
	return nil
}

// pidFile is where the launcher of binary records the server's PID.
func (c *Cluster) pidFile(binary string) string {
	return filepath.Join(c.workDir, "bin", binary+".pid")
}

func (c *Cluster) openLog(name string) (*os.File, error) {
	f, err := os.Create(filepath.Join(c.workDir, name))
	if err != nil {
		return nil, fmt.Errorf("creating control-plane log %s: %w", name, err)
	}
	c.logFiles = append(c.logFiles, f)
	return f, nil
}

// logTails returns the last lines of each control-plane log, to make a
// failed start explain itself (the logs are deleted with the work dir).
func (c *Cluster) logTails() string {
	const maxLines = 15
	var b strings.Builder
	for _, f := range c.logFiles {
		data, err := os.ReadFile(f.Name())
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > maxLines {
			lines = lines[len(lines)-maxLines:]
		}
		fmt.Fprintf(&b, "\n--- last lines of %s:\n%s", filepath.Base(f.Name()), strings.Join(lines, "\n"))
	}
	return b.String()
}

// StopAPIServer stops only the API server; etcd keeps running and the
// certificates and port are kept, so StartAPIServer brings back a server
// that existing clients and kubeconfigs reach again.
func (c *Cluster) StopAPIServer() error {
	if err := c.env.ControlPlane.APIServer.Stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	// Its PID may be reused from now on: keep the watchdog off it.
	if err := os.Remove(c.pidFile(apiServerBinary)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing the kube-apiserver PID file: %w", err)
	}
	c.log.Info("test API server stopped")
	return nil
}

// StartAPIServer restarts the API server stopped by StopAPIServer on the
// same address, with the same etcd and certificates, and waits until it
// serves the default namespace again.
func (c *Cluster) StartAPIServer() error {
	if err := c.env.ControlPlane.APIServer.Start(); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w%s", err, c.logTails())
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.waitReady(ctx); err != nil {
		return fmt.Errorf("restarted kube-apiserver is not serving: %w%s", err, c.logTails())
	}
	c.log.Info("test API server restarted")
	return nil
}

// waitReady polls /readyz until the API server reports ready: /healthz,
// which envtest waits for, turns OK before the server has caught up with
// etcd and can serve requests.
func (c *Cluster) waitReady(ctx context.Context) error {
	rc := c.Client.Discovery().RESTClient()
	for {
		err := rc.Get().AbsPath("/readyz").Do(ctx).Error()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop stops the API server and etcd, and removes the work directory with
// its certificates, data and kubeconfig. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	if c.env != nil {
		if err := c.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping the control plane: %w", err))
		}
	}
	for _, f := range c.forwarders {
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing netns forwarder: %w", err))
		}
	}
	for _, f := range c.logFiles {
		f.Close()
	}
	// Removing the work dir also removes the PID files, so the released
	// watchdog finds nothing to kill.
	if err := os.RemoveAll(c.workDir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", c.workDir, err))
	}
	if err := c.watchdog.release(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		c.log.Info("test cluster stopped")
	}
	return errors.Join(errs...)
}
