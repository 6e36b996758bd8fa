package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// DefaultServiceClusterIPRange is the dual-stack Service CIDR pair the API
// server allocates ClusterIPs from unless Options say otherwise.
const DefaultServiceClusterIPRange = "10.96.0.0/16,fd00:96::/112"

// startTimeout bounds each server's start, stopTimeout the wait for it to
// exit after SIGTERM. A first API server start on a busy 2-core machine takes
// several seconds, and far longer when tests run in parallel with builds.
const (
	startTimeout = 90 * time.Second
	stopTimeout  = 90 * time.Second
)

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

	workDir    string
	pki        *pki
	etcd       *server
	apiServer  *server
	apiPort    string // on 127.0.0.1 (in NetNS mode on both sides)
	forwarders []*netnsForwarder
	watchdog   *watchdog
	netNS      string
	// processes are the programs StartProcess started, in start order.
	processes []*server
	log       *zap.Logger

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
	c := &Cluster{workDir: workDir, log: log, netNS: opts.NetNS}
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
	servingIPs, servingNames := servingAddresses(opts)
	if c.pki, err = newPKI(filepath.Join(workDir, "pki"), servingIPs, servingNames); err != nil {
		return nil, err
	}
	if err := c.startControlPlane(ctx, toolsDir, opts); err != nil {
		return nil, err
	}
	kubeconfig, err := c.kubeconfig()
	if err != nil {
		return nil, err
	}
	c.KubeconfigPath = filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	log.Info("test cluster started",
		zap.String("apiserver", c.Config.Host),
		zap.String("kubeconfig", c.KubeconfigPath),
		zap.String("netns", opts.NetNS),
		zap.Duration("took", time.Since(began)))
	return c, nil
}

// servingAddresses are the addresses and names, beyond loopback and
// localhost, that the API server's certificate must name for clients that
// reach it the way a cluster's clients do: at the advertised address, or
// through the "kubernetes" Service (its ClusterIP, the first address of
// each Service range, and its DNS names), as pods' in-cluster configs do.
func servingAddresses(opts Options) ([]net.IP, []string) {
	var ips []net.IP
	if ip := net.ParseIP(opts.AdvertiseAddress); ip != nil {
		ips = append(ips, ip)
	}
	serviceRange := opts.ServiceClusterIPRange
	if serviceRange == "" {
		serviceRange = DefaultServiceClusterIPRange
	}
	for _, cidr := range strings.Split(serviceRange, ",") {
		if _, ipnet, err := net.ParseCIDR(strings.TrimSpace(cidr)); err == nil {
			first := slices.Clone(ipnet.IP)
			first[len(first)-1]++
			ips = append(ips, first)
		}
	}
	return ips, []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
}

// IssueClientCert makes a client certificate and key (PEM) that the API
// server accepts as user cn in the groups orgs: for a kubelet,
// system:node:NAME in system:nodes.
func (c *Cluster) IssueClientCert(cn string, orgs ...string) (cert, key []byte, err error) {
	return c.pki.issueClient(cn, orgs...)
}

// ServiceAccountKeyPath is the private key the API server verifies
// service-account tokens with, for kube-controller-manager's
// --service-account-private-key-file.
func (c *Cluster) ServiceAccountKeyPath() string { return c.pki.path(serviceAccountKeyFile) }

// CACertPath is the cluster CA's certificate, for --root-ca-file and
// clients' kubeconfigs.
func (c *Cluster) CACertPath() string { return c.pki.path(caCertFile) }

// APIServerPort is the API server's port: on 127.0.0.1 of the host and, in
// NetNS mode, on every address of the namespace.
func (c *Cluster) APIServerPort() string { return c.apiPort }

// maxStartAttempts bounds retries of a start that lost a port race.
const maxStartAttempts = 3

// startControlPlane starts etcd, then the API server. Free ports are found
// by binding and releasing them, so another cluster starting at the same
// time (parallel test packages do) can take one first; such a start is
// retried with new ports.
func (c *Cluster) startControlPlane(ctx context.Context, toolsDir string, opts Options) error {
	for attempt := 1; ; attempt++ {
		err := c.tryStart(ctx, toolsDir, opts)
		if err == nil {
			return nil
		}
		logs := c.logTails()
		err = errors.Join(err, c.apiServer.stop(), c.etcd.stop())
		if attempt < maxStartAttempts && ctx.Err() == nil && strings.Contains(logs, "address already in use") {
			c.log.Warn("test control plane lost a port race; retrying with new ports", zap.Int("attempt", attempt), zap.Error(err))
			continue
		}
		return fmt.Errorf("starting etcd and kube-apiserver from %s: %w%s", toolsDir, err, logs)
	}
}

// tryStart is one attempt of startControlPlane, on fresh ports, data
// directory and logs.
func (c *Cluster) tryStart(ctx context.Context, toolsDir string, opts Options) error {
	if err := c.resetAttempt(); err != nil {
		return err
	}
	dataDir := filepath.Join(c.workDir, "etcd")
	for _, dir := range []string{dataDir, filepath.Join(c.workDir, "bin")} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	if opts.NetNS != "" {
		// A new namespace has lo down, and both servers listen on it.
		if err := bringUpLoopback(opts.NetNS); err != nil {
			return err
		}
	}
	etcdPort, peerPort, err := c.pickPorts(opts.NetNS)
	if err != nil {
		return err
	}
	etcdURL := "http://" + net.JoinHostPort("127.0.0.1", etcdPort)
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", peerPort)
	if c.etcd, err = c.newServer(toolsDir, etcdBinary, opts.NetNS, etcdArgs(dataDir, etcdURL, peerURL)); err != nil {
		return err
	}
	if c.apiServer, err = c.newServer(toolsDir, apiServerBinary, opts.NetNS, c.apiServerArgs(opts, etcdURL)); err != nil {
		return err
	}
	c.Config = c.pki.adminConfig("https://" + net.JoinHostPort("127.0.0.1", c.apiPort))
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return fmt.Errorf("building a clientset for the test API server: %w", err)
	}

	if err := c.etcd.start(ctx, httpOK(etcdURL+"/health")); err != nil {
		return err
	}
	return c.apiServer.start(ctx, c.apiServerReady)
}

// resetAttempt clears what a failed start attempt left: its etcd data,
// launchers, logs and forwarders.
func (c *Cluster) resetAttempt() error {
	for _, f := range c.forwarders {
		f.Close()
	}
	c.forwarders = nil
	for _, name := range []string{"etcd", "bin", etcdBinary + ".log", apiServerBinary + ".log"} {
		if err := os.RemoveAll(filepath.Join(c.workDir, name)); err != nil {
			return fmt.Errorf("clearing %s: %w", name, err)
		}
	}
	return nil
}

// pickPorts sets c.apiPort and returns etcd's client and peer ports. In
// NetNS mode the API server's and etcd's client ports are those of relays
// from the host loopback into the namespace (see netnsForwarder), whose
// listeners keep them reserved on the host; the peer port is used only
// inside the namespace.
func (c *Cluster) pickPorts(nsName string) (etcdPort, peerPort string, err error) {
	if nsName == "" {
		ports, err := freePorts(3)
		if err != nil {
			return "", "", err
		}
		c.apiPort = ports[2]
		return ports[0], ports[1], nil
	}
	var relayed []string
	for range 2 {
		fwd, err := newNetNSForwarder(nsName, c.log)
		if err != nil {
			return "", "", err
		}
		c.forwarders = append(c.forwarders, fwd)
		relayed = append(relayed, fwd.port)
	}
	peer, err := freePorts(1)
	if err != nil {
		return "", "", err
	}
	c.apiPort = relayed[1]
	return relayed[0], peer[0], nil
}

// newServer writes the launcher for binary (see writeLauncher) and returns
// the server it runs.
func (c *Cluster) newServer(toolsDir, binary, nsName string, args []string) (*server, error) {
	launcher, err := writeLauncher(filepath.Join(c.workDir, "bin"), binary, filepath.Join(toolsDir, binary), nsName)
	if err != nil {
		return nil, err
	}
	return &server{
		name:     binary,
		launcher: launcher,
		args:     args,
		logPath:  filepath.Join(c.workDir, binary+".log"),
		pidFile:  c.pidFile(binary),
	}, nil
}

// etcdArgs are the flags of a single-member etcd keeping its data in
// dataDir, serving clients on clientURL.
func etcdArgs(dataDir, clientURL, peerURL string) []string {
	return []string{
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		// Its default, localhost:2380, would collide between clusters.
		"--listen-peer-urls=" + peerURL,
		// The data dies with the cluster; syncing it to disk would only
		// slow every write.
		"--unsafe-no-fsync=true",
	}
}

// apiServerArgs are kube-apiserver's flags: serving on c.apiPort with the
// pki's certificate, RBAC with the admin's client CA, a service-account key
// (required), pods as tests write them (privileged ones too, and without the
// ServiceAccount admission plugin, which rejects pods until the controller
// manager, which no cluster here runs, has made their service account), the
// Options' addresses, and last opts.APIServerArgs, which override any of
// them. These are the flags envtest, which this package used before, set.
func (c *Cluster) apiServerArgs(opts Options, etcdURL string) []string {
	serviceRange := opts.ServiceClusterIPRange
	if serviceRange == "" {
		serviceRange = DefaultServiceClusterIPRange
	}
	args := map[string]string{
		"etcd-servers":                     etcdURL,
		"bind-address":                     "127.0.0.1",
		"secure-port":                      c.apiPort,
		"tls-cert-file":                    c.pki.path(servingCertFile),
		"tls-private-key-file":             c.pki.path(servingKeyFile),
		"client-ca-file":                   c.pki.path(caCertFile),
		"authorization-mode":               "RBAC",
		"service-account-issuer":           "https://" + net.JoinHostPort("127.0.0.1", c.apiPort) + "/",
		"service-account-key-file":         c.pki.path(serviceAccountKeyFile),
		"service-account-signing-key-file": c.pki.path(serviceAccountKeyFile),
		"disable-admission-plugins":        "ServiceAccount",
		"allow-privileged":                 "true",
		"service-cluster-ip-range":         serviceRange,
		// For clusters with kubelets (tests/realcluster): the API
		// server reaches them at their node address, as its client.
		"kubelet-client-certificate":      c.pki.path(kubeletClientCertFile),
		"kubelet-client-key":              c.pki.path(kubeletClientKeyFile),
		"kubelet-preferred-address-types": "InternalIP,Hostname",
	}
	if opts.AdvertiseAddress != "" {
		args["advertise-address"] = opts.AdvertiseAddress
	}
	if opts.NetNS != "" {
		// Listen on every address of the namespace, so clients inside it
		// can also use the advertised address (the "kubernetes"
		// Service's endpoint); the serving certificate names only
		// localhost and loopback, so such clients need tls-server-name:
		// localhost.
		args["bind-address"] = "0.0.0.0"
		if ip := net.ParseIP(opts.AdvertiseAddress); ip != nil && ip.To4() == nil {
			args["bind-address"] = "::"
		}
	}
	maps.Copy(args, opts.APIServerArgs)
	flags := make([]string, 0, len(args))
	for _, name := range slices.Sorted(maps.Keys(args)) {
		flags = append(flags, "--"+name+"="+args[name])
	}
	return flags
}

// apiServerReady reports whether the API server is ready and serves the
// default namespace, where tests put their objects. /readyz, unlike
// /healthz, waits until the server has caught up with etcd; the namespace
// is created by a controller inside the API server a moment later still.
func (c *Cluster) apiServerReady(ctx context.Context) error {
	if err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		return err
	}
	_, err := c.Client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
	return err
}

// kubeconfig renders Config as a kubeconfig file.
func (c *Cluster) kubeconfig() ([]byte, error) {
	const name = "kpr-testcluster"
	data, err := clientcmd.Write(clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{name: {
			Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData,
		}},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{name: {
			ClientCertificateData: c.Config.CertData, ClientKeyData: c.Config.KeyData,
		}},
		Contexts:       map[string]*clientcmdapi.Context{name: {Cluster: name, AuthInfo: name}},
		CurrentContext: name,
	})
	if err != nil {
		return nil, fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	return data, nil
}

// pidFile is where the launcher of binary records the server's PID.
func (c *Cluster) pidFile(binary string) string {
	return filepath.Join(c.workDir, "bin", binary+".pid")
}

// logTails returns the last lines of each control-plane log, to make a
// failed start explain itself (the logs are deleted with the work dir).
func (c *Cluster) logTails() string {
	return LogTail(c.LogPath(apiServerBinary), startLogLines) + LogTail(c.LogPath(etcdBinary), startLogLines)
}

// LogTail is the last n lines of the log at path, headed by its name, or
// "" when it is empty or missing.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return fmt.Sprintf("\n--- last lines of %s:\n%s", filepath.Base(path), strings.Join(lines[max(0, len(lines)-n):], "\n"))
}

// startLogLines is how much of a server's log a failed start shows.
const startLogLines = 15

// StopAPIServer stops only the API server; etcd keeps running and the
// certificates and port are kept, so StartAPIServer brings back a server
// that existing clients and kubeconfigs reach again.
func (c *Cluster) StopAPIServer() error {
	if err := c.apiServer.stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	c.log.Info("test API server stopped")
	return nil
}

// StartAPIServer restarts the API server stopped by StopAPIServer on the
// same address, with the same etcd and certificates, and waits until it
// serves the default namespace again.
func (c *Cluster) StartAPIServer() error {
	if err := c.apiServer.start(context.Background(), c.apiServerReady); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w%s", err, c.logTails())
	}
	c.log.Info("test API server restarted")
	return nil
}

// StartProcess starts binary with args beside the control plane (in its
// network namespace, if it has one), logging to LogPath(name), and waits
// until ready succeeds, if ready is not nil. Such a process is covered by
// the same watchdog as etcd and the API server, and Stop stops it, in the
// reverse of the start order, before them: the controller manager,
// scheduler and node VMs of a cluster with kubelets use it. name must be
// unique in the cluster.
func (c *Cluster) StartProcess(ctx context.Context, name, binary string, args []string, ready func(context.Context) error) error {
	launcher, err := writeLauncher(filepath.Join(c.workDir, "bin"), name, binary, c.netNS)
	if err != nil {
		return err
	}
	s := &server{name: name, launcher: launcher, args: args, logPath: c.LogPath(name), pidFile: c.pidFile(name)}
	if ready == nil {
		ready = func(context.Context) error { return nil }
	}
	c.mu.Lock()
	c.processes = append(c.processes, s)
	c.mu.Unlock()
	if err := s.start(ctx, ready); err != nil {
		return fmt.Errorf("%w%s", err, LogTail(s.logPath, startLogLines))
	}
	return nil
}

// LogPath is the file a server or a process of StartProcess called name
// logs to.
func (c *Cluster) LogPath(name string) string { return filepath.Join(c.workDir, name+".log") }

// WorkDir is the cluster's own directory, removed by Stop: the place for
// files that live as long as the cluster (kubeconfigs, node images).
func (c *Cluster) WorkDir() string { return c.workDir }

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
	for i := len(c.processes) - 1; i >= 0; i-- {
		if err := c.processes[i].stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping %s: %w", c.processes[i].name, err))
		}
	}
	if err := errors.Join(c.apiServer.stop(), c.etcd.stop()); err != nil {
		errs = append(errs, fmt.Errorf("stopping the control plane: %w", err))
	}
	for _, f := range c.forwarders {
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing netns forwarder: %w", err))
		}
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
