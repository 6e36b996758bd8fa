// Package realcluster starts a real Kubernetes cluster on this machine: the
// control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) in a network namespace of its own on the host, and each
// node a qemu VM with Debian's kernel, containerd, runc, the CNI plugins
// and a kubelet, on a bridge in that namespace. The kubelet rewrites kernel
// sysctls and wants a pure cgroup v2 hierarchy, which the shared host must
// keep as it is, so nodes are VMs; nothing of the cluster touches the
// host's network, sysctls or cgroups.
//
// The binaries come from make cluster-tools (hack/cluster-tools.sh), the
// images from make cluster-images, the kernel from hack/kernels.sh; all are
// built or fetched once per machine and cached.
package realcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/kernels/initramfs"
	"github.com/kpr-io/kpr/tests/namedns"
	"github.com/kpr-io/kpr/tests/realcluster/nodeconfig"
)

// Options configure Up.
type Options struct {
	// Nodes is the number of node VMs; default 2.
	Nodes int
	// ToolsDir holds the cluster's binaries (make cluster-tools); default
	// $KPR_CLUSTER_TOOLS_DIR.
	ToolsDir string
	// ImagesDir holds the image archives every node imports (make
	// cluster-images); default $KPR_CLUSTER_IMAGES_DIR.
	ImagesDir string
	// Images are the archives of ImagesDir to import, by file name
	// (agnhost.tar); default all of them. Each costs the node's boot
	// time (importing agnhost's takes most of a minute under emulation).
	Images []string
	// ExtraImages are more archives to import, such as kpr's own from
	// make image.
	ExtraImages []string
	// Registry serves the images from a registry on the cluster network
	// (hack/image/clusterregistry), which the nodes' containerd pulls
	// registry.k8s.io, docker.io and ghcr.io images from, instead of
	// importing every archive at boot: nodes boot sooner, hold only the
	// images their pods use, and imagePullPolicy Always pulls as on a
	// real cluster.
	Registry bool
	// ImageAliases are more names for the registry to serve images under,
	// as NEW=EXISTING (docker.io/library/nginx:latest=registry.k8s.io/...).
	ImageAliases []string
	// KernelDir is hack/kernels.sh's cache of the nodes' kernel; default
	// the trixie (Debian 13, Linux 6.12) one, fetched if missing.
	KernelDir string
	// MemoryMB is each VM's memory; default 3072.
	MemoryMB int
	// Logger receives progress; default a no-op logger.
	Logger *zap.Logger
}

// Cluster is a running cluster.
type Cluster struct {
	*cluster.Cluster
	// NetNS is the namespace of the control plane and the cluster network.
	NetNS string
	// Nodes are the nodes' names.
	Nodes []string

	nodes    []node
	toolsDir string
	log      *zap.Logger
}

// nodeBinaries are the programs every node runs, from the tools directory.
var nodeBinaries = []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc"}

// cniPlugins are the CNI plugins every node has.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// Up starts a cluster and waits until every node is Ready. On error nothing
// is left running.
func Up(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	log := opts.Logger
	c := &Cluster{NetNS: fmt.Sprintf("kpr-rc-%d", os.Getpid()), toolsDir: opts.ToolsDir, log: log}
	for i := 1; i <= opts.Nodes; i++ {
		c.nodes = append(c.nodes, newNode(i))
		c.Nodes = append(c.Nodes, c.nodes[i-1].name)
	}
	ns, err := namedns.Create(c.NetNS)
	if err != nil {
		return nil, fmt.Errorf("creating the cluster's network namespace: %w", err)
	}
	ns.Close()
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, c.Down())
		}
	}()
	if err := setUpNetwork(c.NetNS, c.nodes); err != nil {
		return nil, err
	}
	began := time.Now()
	c.Cluster, err = cluster.Start(ctx, cluster.Options{
		ServiceClusterIPRange: serviceCIDR.String(),
		NetNS:                 c.NetNS,
		AdvertiseAddress:      controlPlane.String(),
		APIServerArgs: map[string]string{
			// Kubelets are nodes to the Node authorizer; pods get
			// their ServiceAccount's token, which the controller
			// manager makes.
			"authorization-mode":        "Node,RBAC",
			"disable-admission-plugins": "",
		},
		Logger: log,
	})
	if err != nil {
		return nil, err
	}
	if err := c.startControllers(ctx, opts); err != nil {
		return nil, err
	}
	log.Info("control plane up", zap.Duration("took", time.Since(began)))
	if err := c.startNodes(ctx, opts); err != nil {
		return nil, err
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	log.Info("cluster up", zap.Strings("nodes", c.Nodes), zap.Duration("took", time.Since(began)))
	return c, nil
}

func (o *Options) defaults() error {
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.Nodes > 200 {
		return fmt.Errorf("realcluster: %d nodes do not fit the cluster network", o.Nodes)
	}
	var err error
	if o.ToolsDir, err = cacheDir(o.ToolsDir, "KPR_CLUSTER_TOOLS_DIR", "hack/cluster-tools.sh"); err != nil {
		return err
	}
	// The images carry binaries of the tools build (pause, coredns, agnhost).
	if o.ImagesDir, err = cacheDir(o.ImagesDir, "KPR_CLUSTER_IMAGES_DIR", "hack/cluster-images.sh", "KPR_CLUSTER_TOOLS_DIR="+o.ToolsDir); err != nil {
		return err
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 3072
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return nil
}

// cacheDir is dir if set, else $env if set, else the directory script
// prints once it has built (or found up to date) what it caches there: the
// same directory make cluster-tools and make cluster-images fill. The
// script runs with scriptEnv added to the environment; its progress goes to
// stderr.
func cacheDir(dir, env, script string, scriptEnv ...string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if dir = os.Getenv(env); dir != "" {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(root, script))
	cmd.Env = append(os.Environ(), scriptEnv...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s (set %s to use a build of your own): %w", script, env, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Down stops every VM and server and removes the namespace. It is safe to
// call more than once.
func (c *Cluster) Down() error {
	var errs []error
	if c.Cluster != nil {
		errs = append(errs, c.Cluster.Stop())
	}
	if err := namedns.Delete(c.NetNS); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// startControllers starts kube-controller-manager (the EndpointSlice,
// ServiceAccount, Deployment and other controllers) and kube-scheduler,
// both as the admin, in the control plane's namespace.
func (c *Cluster) startControllers(ctx context.Context, opts Options) error {
	kcm := []string{
		"--kubeconfig=" + c.KubeconfigPath,
		"--authentication-kubeconfig=" + c.KubeconfigPath,
		"--authorization-kubeconfig=" + c.KubeconfigPath,
		"--service-account-private-key-file=" + c.ServiceAccountKeyPath(),
		"--root-ca-file=" + c.CACertPath(),
		"--service-cluster-ip-range=" + serviceCIDR.String(),
		"--cluster-cidr=" + podCIDR.String(),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--use-service-account-credentials=false",
		// Nodes that stop reporting have their pods moved after 5 min by
		// default; the tests would rather see it sooner.
		"--node-monitor-grace-period=40s",
	}
	if err := c.StartProcess(ctx, "kube-controller-manager", filepath.Join(opts.ToolsDir, "kube-controller-manager"), kcm, nil); err != nil {
		return err
	}
	scheduler := []string{
		"--kubeconfig=" + c.KubeconfigPath,
		"--authentication-kubeconfig=" + c.KubeconfigPath,
		"--authorization-kubeconfig=" + c.KubeconfigPath,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
	}
	return c.StartProcess(ctx, "kube-scheduler", filepath.Join(opts.ToolsDir, "kube-scheduler"), scheduler, nil)
}

// startNodes packs the nodes' initramfs and boots a VM per node.
func (c *Cluster) startNodes(ctx context.Context, opts Options) error {
	images, err := filepath.Glob(filepath.Join(opts.ImagesDir, "*.tar"))
	if err != nil {
		return err
	}
	if opts.Images != nil {
		images = nil
		for _, name := range opts.Images {
			images = append(images, filepath.Join(opts.ImagesDir, name))
		}
	}
	images = append(images, opts.ExtraImages...)
	kernelDir := opts.KernelDir
	if kernelDir == "" {
		root, err := repoRoot()
		if err != nil {
			return err
		}
		out, err := exec.Command(filepath.Join(root, "hack/kernels.sh"), "trixie").Output()
		if err != nil {
			return fmt.Errorf("fetching the nodes' kernel (hack/kernels.sh trixie): %w", err)
		}
		kernelDir = strings.TrimSpace(string(out))
	}
	registry := ""
	if opts.Registry {
		if err := c.startRegistry(ctx, images, opts.ImageAliases); err != nil {
			return err
		}
		registry, images = registryAddr, nil
	}
	initrd := filepath.Join(c.WorkDir(), "node-initramfs.cpio")
	if err := packNode(initrd, kernelDir, opts.ToolsDir, images); err != nil {
		return fmt.Errorf("packing the nodes' initramfs: %w", err)
	}
	caCert, err := os.ReadFile(c.CACertPath())
	if err != nil {
		return err
	}
	for _, n := range c.nodes {
		cert, key, err := c.IssueClientCert("system:node:"+n.name, "system:nodes")
		if err != nil {
			return err
		}
		cfg, err := nodeConfig(n, c.nodes, c.APIServerPort(), nodeSecrets{caCert: caCert, clientCert: cert, clientKey: key}, images, registry)
		if err != nil {
			return err
		}
		cfgPath := filepath.Join(c.WorkDir(), n.name+".json")
		data, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
			return err
		}
		args := []string{
			"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", strconv.Itoa(opts.MemoryMB),
			"-kernel", filepath.Join(kernelDir, "vmlinuz"), "-initrd", initrd,
			// no_timer_check: under emulation on a busy host the
			// IO-APIC timer check can miss its ticks and panic.
			"-append", "console=ttyS0 loglevel=4 panic=-1 no_timer_check rdinit=/init",
			"-netdev", "tap,id=net0,ifname=" + n.tap + ",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net0,mac=" + n.mac,
			"-fw_cfg", "name=" + nodeconfig.FwCfgName + ",file=" + cfgPath,
			"-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio",
		}
		if err := c.StartProcess(ctx, "vm-"+n.name, "/usr/bin/qemu-system-x86_64", args, nil); err != nil {
			return err
		}
		c.log.Info("node VM started", zap.String("node", n.name), zap.String("console", c.LogPath("vm-"+n.name)))
	}
	return nil
}

// registryAddr is where the cluster's registry listens, on the control
// plane's address in the cluster network.
var registryAddr = net.JoinHostPort(controlPlane.String(), "5000")

// startRegistry builds hack/image/clusterregistry and serves the archives
// from it in the cluster's namespace, waiting until every image is in.
func (c *Cluster) startRegistry(ctx context.Context, archives, aliases []string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	bin := filepath.Join(c.WorkDir(), "clusterregistry")
	build := exec.Command("go", "build", "-o", bin, "./clusterregistry")
	build.Dir = filepath.Join(root, "hack/image")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building hack/image/clusterregistry: %v: %s", err, out)
	}
	args := []string{"-listen", registryAddr}
	for _, a := range aliases {
		args = append(args, "-alias", a)
	}
	args = append(args, archives...)
	logPath := c.LogPath("registry")
	return c.StartProcess(ctx, "registry", bin, args, func(context.Context) error {
		if data, _ := os.ReadFile(logPath); strings.Contains(string(data), "ready:") {
			return nil
		}
		return errors.New("loading the images")
	})
}

// nodeBootTimeout bounds a node's way from boot to Ready under emulation.
const nodeBootTimeout = 15 * time.Minute

// waitNodesReady waits until every node is registered and Ready.
func (c *Cluster) waitNodesReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, nodeBootTimeout)
	defer cancel()
	for {
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		ready := 0
		if err == nil {
			for _, n := range list.Items {
				for _, cond := range n.Status.Conditions {
					if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
		}
		if ready == len(c.nodes) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d nodes Ready after %s (consoles: %s): %w", ready, len(c.nodes), nodeBootTimeout, c.LogPath("vm-*"), ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}

// packNode writes the initramfs every node boots: the init, busybox, the
// node's binaries and CNI plugins, iptables with its plugins (the portmap
// plugin's), the kernel's modules and the image archives.
func packNode(path, kernelDir, toolsDir string, images []string) error {
	init, err := buildInit(filepath.Dir(path))
	if err != nil {
		return err
	}
	w, err := initramfs.Create(path)
	if err != nil {
		return err
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "run", "tmp", "root", "etc", "var", "usr", "usr/local", "usr/local/bin", "opt", "opt/cni", "opt/cni/bin", "kpr", "kpr/modules", "images"} {
		w.Dir(d)
	}
	w.File("init", init, 0o755)
	shadowed := map[string]bool{}
	for _, t := range iptablesTools {
		shadowed[filepath.Base(t)] = true
	}
	if err := w.Busybox(busybox, shadowed); err != nil {
		return err
	}
	for _, b := range nodeBinaries {
		w.File("usr/local/bin/"+b, filepath.Join(toolsDir, b), 0o755)
	}
	for _, p := range cniPlugins {
		w.File("opt/cni/bin/"+p, filepath.Join(toolsDir, "cni", p), 0o755)
	}
	for _, tool := range append(slices.Clone(iptablesTools), initramfs.XtablesPlugins()...) {
		if err := w.Dynamic(tool); err != nil {
			return err
		}
	}
	w.File("kpr/modules.load", filepath.Join(kernelDir, "modules.load"), 0o644)
	mods, err := filepath.Glob(filepath.Join(kernelDir, "modules", "*.ko"))
	if err != nil {
		return err
	}
	for _, m := range mods {
		w.File("kpr/modules/"+filepath.Base(m), m, 0o644)
	}
	for _, img := range images {
		w.File("images/"+filepath.Base(img), img, 0o644)
	}
	return w.Close()
}

// iptablesTools are the host's iptables commands, which the portmap CNI
// plugin runs on the node.
var iptablesTools = []string{"/usr/sbin/iptables", "/usr/sbin/iptables-save", "/usr/sbin/iptables-restore",
	"/usr/sbin/ip6tables", "/usr/sbin/ip6tables-save", "/usr/sbin/ip6tables-restore"}

// busybox is Debian's static busybox (busybox-static, which hack/deps.sh
// installs), the nodes' shell and small tools.
const busybox = "/bin/busybox"

// buildInit builds tests/realcluster/nodeinit, static, into dir.
func buildInit(dir string) (string, error) {
	out := filepath.Join(dir, "nodeinit")
	cmd := exec.Command("go", "build", "-o", out, "github.com/kpr-io/kpr/tests/realcluster/nodeinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the node init: %v: %s", err, b)
	}
	return out, nil
}

// repoRoot is the directory of kpr's go.mod, wherever the caller runs.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return "", fmt.Errorf("finding kpr's module root (go env GOMOD): %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}
