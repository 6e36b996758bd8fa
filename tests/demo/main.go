package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// The demo's cast. The node address is from TEST-NET-1 (RFC 5737) and only
// ever exists inside the node namespace.
const (
	nodeName      = "demo-node"
	serviceNS     = "default"
	serviceName   = "web"
	sliceName     = "web-demo"
	servicePort   = 80
	podPort       = 8080
	requestsShown = 12
)

var nodeAddr = netip.MustParsePrefix("192.0.2.10/24")

// Exit codes: 1 for a failure, 130 (128+SIGINT, as shells report it) when
// interrupted.
const (
	exitFailed      = 1
	exitInterrupted = 130
)

func main() {
	os.Exit(run(os.Stdout, os.Stderr))
}

// run is the demo: the narration goes to out, failures and their logs to
// errOut. It returns the exit code.
func run(out, errOut io.Writer) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(errOut, "kpr demo: needs root, to create network namespaces and a cgroup and to load BPF programs; run `sudo make demo`")
		return exitFailed
	}
	// Caught until the very end, so a second Ctrl-C cannot cut the teardown
	// short and leave namespaces or BPF programs behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	d, err := newDemo(out)
	if err != nil {
		fmt.Fprintf(errOut, "kpr demo: %v\n", err)
		return exitFailed
	}
	began := time.Now()
	fmt.Fprintln(d.out, "kpr demo: one simulated node, a Service with three pods, and kpr balancing it")
	runErr := d.steps(ctx)
	interrupted := ctx.Err() != nil
	switch {
	case interrupted:
		d.abortStep("interrupted")
		fmt.Fprintln(d.out, "interrupted: tearing everything down")
	case runErr != nil:
		d.abortStep("FAILED")
		d.failed = true
	}

	d.begin("teardown")
	teardownErr := d.td.run()
	if teardownErr != nil {
		d.finish("incomplete")
		d.failed = true
	} else {
		d.finish("%s", d.teardownSummary())
	}

	if runErr != nil && !interrupted {
		fmt.Fprintf(errOut, "\nkpr demo FAILED: %v\n", runErr)
	}
	if teardownErr != nil {
		fmt.Fprintf(errOut, "\nkpr demo: teardown problems (check `ip netns list`, %s and the cgroup2 mount): %v\n", d.bpfRoot, teardownErr)
	}
	if d.failed {
		d.printLogs(errOut)
		return exitFailed
	}
	// Nothing to look at: do not leave the logs lying around.
	_ = os.RemoveAll(d.logDir)
	if interrupted {
		return exitInterrupted
	}
	fmt.Fprintf(d.out, "done in %.1fs\n", time.Since(began).Seconds())
	return 0
}

// demo holds what the steps create, for the steps after them.
type demo struct {
	out io.Writer
	td  *teardown

	// logDir holds every log; it is kept and named only on failure.
	logDir  string
	log     *zap.Logger
	logs    []string // paths worth reading after a failure
	failed  bool
	step    int
	pending bool // a step line is printed but not finished

	kprBin  string
	bpfRoot string
	cluster *cluster.Cluster
	kube    kubeobj.Client
	node    *harness.Node
	cgroup  *harness.Cgroup
	kpr     *kprproc.Process
	service *v1.Service
	members []string // the pods the EndpointSlice lists
	client  client
}

func newDemo(out io.Writer) (*demo, error) {
	dir, err := os.MkdirTemp("", "kpr-demo-")
	if err != nil {
		return nil, fmt.Errorf("create a directory for the logs: %w", err)
	}
	logPath := filepath.Join(dir, "demo.log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", logPath, err)
	}
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), f, zap.DebugLevel))
	// client-go (klog) would otherwise write to the terminal.
	klog.SetLogger(zapr.NewLogger(log.Named("klog")))
	return &demo{
		out:    out,
		td:     &teardown{},
		logDir: dir,
		log:    log,
		logs:   []string{logPath},
		// A directory of its own, so the demo never adopts or removes the
		// dataplane of a kpr already running on this machine.
		bpfRoot: "/sys/fs/bpf/kpr-demo-" + filepath.Base(dir)[len("kpr-demo-"):],
	}, nil
}

// teardownSummary says what the teardown undid.
func (d *demo) teardownSummary() string {
	var removed []string
	for _, what := range []struct {
		made bool
		name string
	}{
		{d.cgroup != nil, "cgroup"},
		{d.node != nil, "pods"},
		{d.node != nil, "node netns"},
		{d.cluster != nil, "API server"},
	} {
		if what.made {
			removed = append(removed, what.name)
		}
	}
	var parts []string
	if d.kpr != nil {
		parts = append(parts, "kpr stopped and `kpr cleanup` run")
	}
	switch n := len(removed); {
	case n == 1:
		parts = append(parts, "removed the "+removed[0])
	case n > 1:
		parts = append(parts, "removed the "+strings.Join(removed[:n-1], ", ")+" and "+removed[n-1])
	}
	if len(parts) == 0 {
		return "nothing to remove"
	}
	return strings.Join(parts, "; ")
}

// begin prints a numbered step's title; finish completes its line.
func (d *demo) begin(title string) {
	d.step++
	fmt.Fprintf(d.out, "%2d. %s: ", d.step, title)
	d.pending = true
}

func (d *demo) finish(format string, args ...any) {
	fmt.Fprintf(d.out, format+"\n", args...)
	d.pending = false
}

// abortStep ends a step line left open by a failure.
func (d *demo) abortStep(word string) {
	if d.pending {
		d.finish("%s", word)
	}
}

// steps runs the demo proper. Everything it creates is registered with d.td
// as soon as it exists.
func (d *demo) steps(ctx context.Context) (err error) {
	// A panic must not skip the teardown: turn it into the demo's error.
	defer func() {
		if v := recover(); v != nil {
			if f, ok := v.(fatal); ok {
				err = f.err
				return
			}
			err = fmt.Errorf("panic: %v\n%s", v, debug.Stack())
		}
	}()
	for _, step := range []func(context.Context) error{
		d.buildKpr,
		d.startCluster,
		d.buildNode,
		d.createService,
		d.startKpr,
		d.showBalancing,
		d.showDump,
		d.removePod,
		d.addPod,
	} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// buildKpr builds the kpr binary before anything is set up, so a build
// error leaves nothing to tear down.
func (d *demo) buildKpr(context.Context) error {
	d.begin("kpr binary")
	began := time.Now()
	bin, err := kprproc.Binary()
	if err != nil {
		return err
	}
	d.kprBin = bin
	d.finish("built in %.1fs", time.Since(began).Seconds())
	return nil
}

func (d *demo) startCluster(ctx context.Context) error {
	d.begin("local API server")
	buildLog := filepath.Join(d.logDir, "tools-build.log")
	bl, err := os.Create(buildLog)
	if err != nil {
		return err
	}
	defer bl.Close()
	d.logs = append(d.logs, buildLog)
	began := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Logger: d.log.Named("cluster"), BuildLog: bl})
	if err != nil {
		return err
	}
	d.cluster = c
	// The cluster keeps its logs in its work directory, which Stop
	// removes: save them first if they may be needed.
	workDir := filepath.Dir(c.KubeconfigPath)
	d.td.Cleanup(func() {
		if d.failed {
			d.saveLogs(workDir, "kube-apiserver.log", "etcd.log")
		}
		if err := c.Stop(); err != nil {
			d.td.Errorf("stop the API server: %v", err)
		}
	})
	d.kube = kubeobj.Client{Interface: c.Client}
	d.finish("kube-apiserver and etcd up at %s (%.1fs)", c.Config.Host, time.Since(began).Seconds())
	return nil
}

// saveLogs copies the named files of dir into the demo's log directory.
func (d *demo) saveLogs(dir string, names ...string) {
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		dst := filepath.Join(d.logDir, name)
		if os.WriteFile(dst, data, 0o644) == nil {
			d.logs = append(d.logs, dst)
		}
	}
}

// buildNode creates the node namespace with three serving pods, the demo
// cgroup (which this process enters, so its client sockets are kpr's to
// translate) and the Node object kpr looks up.
func (d *demo) buildNode(ctx context.Context) error {
	d.begin("node")
	node, err := harness.NewNode(d.td, harness.Options{})
	if err != nil {
		return err
	}
	d.node = node
	if err := node.AddAddress(nodeAddr); err != nil {
		return err
	}
	var pods []string
	for i := 1; i <= 3; i++ {
		pod, err := d.startPod(kubeobj.Name(serviceName, i))
		if err != nil {
			return err
		}
		pods = append(pods, fmt.Sprintf("%s %s", pod.Name, pod.IPv4))
	}
	cg, err := harness.NewCgroup(d.td)
	if err != nil {
		return err
	}
	d.cgroup = cg
	if err := cg.EnterProcess(); err != nil {
		return err
	}
	if err := d.cluster.CreateNode(ctx, nodeName, []string{nodeAddr.Addr().String()}, nil); err != nil {
		return err
	}
	d.finish("netns %s, pods %s serving HTTP :%d; cgroup %s",
		node.NetNS.Name, strings.Join(pods, ", "), podPort, filepath.Base(cg.Path))
	return nil
}

func (d *demo) startPod(name string) (*harness.Pod, error) {
	pod, err := d.node.AddPod(name)
	if err != nil {
		return nil, err
	}
	if _, err := pod.ServeHTTP(podPort); err != nil {
		return nil, err
	}
	return pod, nil
}

func (d *demo) createService(ctx context.Context) error {
	d.begin("Service")
	svc, err := d.kube.CreateService(ctx, kubeobj.Service(serviceNS, serviceName,
		kubeobj.Port{Name: "http", Port: servicePort, TargetPort: podPort}))
	if err != nil {
		return err
	}
	d.service = svc
	ip, err := kubeobj.ClusterIP(svc, v1.IPv4Protocol)
	if err != nil {
		return err
	}
	d.client = client{ns: d.node.NetNS, target: netip.AddrPortFrom(ip, servicePort)}
	pods := d.podNames()
	if err := d.writeSlice(ctx, pods...); err != nil {
		return err
	}
	d.finish("%s/%s ClusterIP %s -> :%d; EndpointSlice %s lists %s",
		serviceNS, serviceName, d.client.target, podPort, sliceName, strings.Join(pods, ", "))
	return nil
}

// podNames lists the node's pods in creation order.
func (d *demo) podNames() []string {
	var names []string
	for _, p := range d.node.Pods() {
		names = append(names, p.Name)
	}
	return names
}

// writeSlice makes the Service's EndpointSlice list exactly the named pods,
// as the EndpointSlice controller would (none runs here).
func (d *demo) writeSlice(ctx context.Context, pods ...string) error {
	var eps []kubeobj.Endpoint
	for _, name := range pods {
		eps = append(eps, kubeobj.Endpoint{Addr: d.node.Pod(name).IPv4, NodeName: nodeName})
	}
	if err := d.kube.ApplySlice(ctx, kubeobj.Slice(d.service, sliceName, discoveryv1.AddressTypeIPv4, eps...)); err != nil {
		return err
	}
	d.members = slices.Clone(pods)
	return nil
}

func (d *demo) startKpr(ctx context.Context) error {
	d.begin("kpr run")
	logPath := filepath.Join(d.logDir, "kpr.log")
	d.logs = append(d.logs, logPath)
	began := time.Now()
	p, err := kprproc.Start(kprproc.Options{
		Kubeconfig: d.cluster.KubeconfigPath,
		NodeName:   nodeName,
		CgroupRoot: d.cgroup.Path,
		BPFRoot:    d.bpfRoot,
		LogPath:    logPath,
	})
	if err != nil {
		return err
	}
	d.kpr = p
	d.td.Cleanup(func() {
		// SIGTERM, as a DaemonSet rollout would: kpr leaves the dataplane
		// in place, and `kpr cleanup` then removes it.
		if err := p.Stop(); err != nil {
			d.td.Errorf("stop kpr run: %v", err)
		}
		if err := p.Cleanup(); err != nil {
			d.td.Errorf("%v", err)
		}
	})
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := p.WaitSynced(waitCtx); err != nil {
		return err
	}
	// /healthz turns 200 as soon as kpr has seen its Node, which can be
	// before its first sync (kube-proxy behaves the same): wait for the
	// Service itself to reach the maps.
	watch, err := newMapWatcher(d.bpfRoot)
	if err != nil {
		return err
	}
	defer watch.Close()
	if _, err := watch.waitFor(waitCtx, d.client.target, d.memberAddrs(d.members), began); err != nil {
		return err
	}
	d.finish("pid %d healthy, Service in its maps after %.1fs; programs on the demo cgroup, maps pinned in %s",
		p.PID(), time.Since(began).Seconds(), d.bpfRoot)
	return nil
}

// memberAddrs returns the IPv4 addresses of the named pods.
func (d *demo) memberAddrs(pods []string) []netip.Addr {
	var addrs []netip.Addr
	for _, name := range pods {
		addrs = append(addrs, d.node.Pod(name).IPv4)
	}
	return addrs
}

func (d *demo) showBalancing(ctx context.Context) error {
	d.begin(fmt.Sprintf("GET http://%s/ from the node", d.client.target))
	t, err := d.client.sample(ctx, requestsShown, d.podNames())
	if err != nil {
		return err
	}
	d.finish("%d answers: %s", t.total(), t)
	return nil
}

// showDump prints `kpr dump`'s table, as an operator would see it.
func (d *demo) showDump(ctx context.Context) error {
	d.begin("kpr dump")
	out, err := exec.CommandContext(ctx, d.kprBin, "dump", "--bpf-root", d.bpfRoot).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kpr dump: %w\n%s", err, out)
	}
	note := "the Services in kpr's maps"
	if k, err := d.kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err == nil {
		note += fmt.Sprintf(" (%s is the API server's own \"kubernetes\" Service)", k.Spec.ClusterIP)
	}
	d.finish("%s", note)
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Fprintf(d.out, "    %s\n", line)
	}
	return nil
}

// removePod takes the last pod out of the slice while it keeps serving, so
// any request still sent to it would show up in the tally.
func (d *demo) removePod(ctx context.Context) error {
	gone := d.members[len(d.members)-1]
	keep := slices.Clone(d.members[:len(d.members)-1])
	d.begin(fmt.Sprintf("%s removed from the EndpointSlice", gone))
	took, err := d.changeSlice(ctx, keep)
	if err != nil {
		return err
	}
	t, err := d.client.sample(ctx, requestsShown, keep)
	if err != nil {
		return err
	}
	if n := t[gone]; n > 0 {
		return fmt.Errorf("%s answered %d requests after kpr's maps dropped it (answers: %s)", gone, n, t)
	}
	d.finish("out of kpr's maps %s after the API write; %d answers: %s (%s, still running, got none)",
		roundDuration(took), t.total(), t, gone)
	return nil
}

// addPod starts a fourth pod and adds it to the slice beside the remaining
// ones.
func (d *demo) addPod(ctx context.Context) error {
	name := kubeobj.Name(serviceName, len(d.node.Pods())+1)
	d.begin(fmt.Sprintf("%s started and added to the EndpointSlice", name))
	pod, err := d.startPod(name)
	if err != nil {
		return err
	}
	serving := append(slices.Clone(d.members), pod.Name)
	took, err := d.changeSlice(ctx, serving)
	if err != nil {
		return err
	}
	t, err := d.client.sample(ctx, requestsShown, serving)
	if err != nil {
		return err
	}
	d.finish("in kpr's maps %s after the API write; %d answers: %s", roundDuration(took), t.total(), t)
	return nil
}

// changeSlice writes the slice with the given pods and returns how long
// after the API server acknowledged the write kpr's maps held exactly them.
func (d *demo) changeSlice(ctx context.Context, pods []string) (time.Duration, error) {
	watch, err := newMapWatcher(d.bpfRoot)
	if err != nil {
		return 0, err
	}
	defer watch.Close()
	want := d.memberAddrs(pods)
	if err := d.writeSlice(ctx, pods...); err != nil {
		return 0, err
	}
	written := time.Now()
	took, err := watch.waitFor(ctx, d.client.target, want, written)
	if err != nil && d.kpr.Exited() {
		err = fmt.Errorf("%w (kpr run has exited: see kpr.log)", err)
	}
	return took, err
}

// roundDuration shows sub-second durations in milliseconds with one decimal.
func roundDuration(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	}
	return d.Round(10 * time.Millisecond).String()
}

// printLogs names the files that explain a failure, or removes the log
// directory if nothing was logged.
func (d *demo) printLogs(w io.Writer) {
	var written []string
	for _, p := range d.logs {
		if info, err := os.Stat(p); err == nil && info.Size() > 0 {
			written = append(written, p)
		}
	}
	if len(written) == 0 {
		_ = os.RemoveAll(d.logDir)
		return
	}
	fmt.Fprintln(w, "logs:")
	for _, p := range written {
		fmt.Fprintf(w, "  %s\n", p)
	}
}
