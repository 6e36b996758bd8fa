package realcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/harness"
)

// operationsEnv, with kprImageEnv and kprNextImageEnv, makes TestOperations
// run; make test-cluster-operations sets them.
const operationsEnv = "KPR_CLUSTER_OPERATIONS"

// The workloads of TestOperations. backend answers HTTP and, once told to
// stop, keeps serving for 15 s (agnhost netexec --delay-shutdown), as a
// well-behaved server does while its endpoint goes terminating. echo
// echoes every TCP connection until the peer closes it (busybox nc -ll -e
// cat). client sends a request every 10 ms, round robin to backend's
// ClusterIP and its NodePort on each node, and holds three long-lived
// connections to echo's ClusterIP and one to its NodePort on the other
// node, writing a line on each every second; it counts answers and writes
// a log line for every failed request (no answer within 10 s: the emulated
// nodes are slow) and every connection that ends.
const operationsWorkloads = `apiVersion: apps/v1
kind: Deployment
metadata: {name: backend, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: backend}}
  template:
    metadata: {labels: {app: backend}}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
        - name: netexec
          image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
          args: [netexec, --http-port=8080, --delay-shutdown=15]
          readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: default}
spec:
  type: NodePort
  selector: {app: backend}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
        - name: echo
          image: registry.k8s.io/e2e-test-images/busybox:1.37.0-2
          command: [nc, -ll, -p, "9000", -e, cat]
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  type: NodePort
  selector: {app: echo}
  ports: [{port: 9000}]
`

// operationsClient is the client Deployment; %s are the NodePort URLs of
// backend and the address:port of echo's NodePort on the other node.
const operationsClient = `apiVersion: apps/v1
kind: Deployment
metadata: {name: client, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client}}
    spec:
      nodeName: %s
      containers:
        - name: client
          image: registry.k8s.io/e2e-test-images/busybox:1.37.0-2
          command:
            - sh
            - -c
            - |
              # A connection that never answered (the Service not yet
              # resolvable) is retried; one that answered and ended is broken.
              hold() {
                while :; do
                  while :; do date +%%s; sleep 1; done | nc $2 $3 | while read -r ts; do echo "$ts" > /tmp/held-$1; done
                  [ -e /tmp/held-$1 ] && break
                  sleep 1
                done
                echo "BROKEN $1 $(date +%%T)"
              }
              hold clusterip-1 echo.default.svc.cluster.local 9000 &
              hold clusterip-2 echo.default.svc.cluster.local 9000 &
              hold clusterip-3 echo.default.svc.cluster.local 9000 &
              hold nodeport %s &
              ok=0
              while :; do
                for url in http://backend.default.svc.cluster.local/hostname %s; do
                  if wget -q -T 10 -O /dev/null "$url" 2>/tmp/wget-err; then ok=$((ok+1)); else echo "FAIL $url $(date +%%T) $(cat /tmp/wget-err)"; fi
                done
                echo "$ok" > /tmp/answered
                usleep 10000
              done
`

// TestOperations runs the operations a platform team does with kpr, on a
// real cluster, while a client pod sends requests every 10 ms and holds
// long-lived connections, and a client outside the nodes requests the
// NodePort every 10 ms: the migration from kube-proxy (kubeadm's, nftables
// mode) to kpr node by node as docs/migration.md says, a rolling update
// of kpr, a kpr pod deleted, a backend scaled down and up with graceful
// termination, and the rollback to kube-proxy with the chart's uninstall.
// Each must lose no request and break no connection.
func TestOperations(t *testing.T) {
	harness.RequireRoot(t)
	image, next := os.Getenv(kprImageEnv), os.Getenv(kprNextImageEnv)
	if image == "" || next == "" || os.Getenv(operationsEnv) == "" {
		t.Skipf("skipping: make test-cluster-operations sets %s, %s and %s and runs this test", operationsEnv, kprImageEnv, kprNextImageEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
	defer cancel()
	c := upForTest(ctx, t, Options{
		Images:      []string{"pause.tar", "coredns.tar", "agnhost.tar", "busybox.tar", "kube-proxy.tar"},
		ExtraImages: []string{image, next},
	})
	o := &operations{t: t, ctx: ctx, c: c}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "deploy/helm/kpr")

	// A cluster as kubeadm makes it: kube-proxy in nftables mode, CoreDNS.
	if err := c.InstallKubeProxy(ctx, "nftables"); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCoreDNS(ctx); err != nil {
		t.Fatal(err)
	}
	o.rollout("kube-system", "daemonset/kube-proxy")
	o.rollout("kube-system", "deployment/coredns")
	o.apply(operationsWorkloads)
	o.rollout("default", "deployment/backend")
	o.rollout("default", "deployment/echo")
	backendPort, echoPort := o.nodePort("backend"), o.nodePort("echo")
	var nodePortURLs []string
	for _, n := range c.nodes {
		nodePortURLs = append(nodePortURLs, fmt.Sprintf("http://%s:%d/hostname", n.address, backendPort))
	}
	o.apply(fmt.Sprintf(operationsClient, c.nodes[0].name,
		fmt.Sprintf("%s %d", c.nodes[1].address, echoPort), strings.Join(nodePortURLs, " ")))
	o.rollout("default", "deployment/client")
	if err := c.WaitAnswer(ctx, nodePortURLs, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	o.startOutside(nodePortURLs)
	o.check("kube-proxy alone")

	// docs/migration.md, "Procedure, node by node": kube-proxy kept off
	// the nodes labelled kpr.io/proxy=kpr, kpr only on them.
	o.step("kube-proxy's DaemonSet gets the kpr.io/proxy affinity")
	o.run("kubectl", "-n", "kube-system", "patch", "daemonset", "kube-proxy", "--type=merge", "-p",
		`{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":`+
			`{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kpr.io/proxy","operator":"NotIn","values":["kpr"]}]}]}}}}}}}`)
	o.rollout("kube-system", "daemonset/kube-proxy")
	o.step("helm install kpr with the kpr.io/proxy node selector")
	o.run("helm", "install", "kpr", chart, "--namespace", "kpr-system", "--create-namespace",
		"--set", "apiServer.host="+controlPlane.String(), "--set", "apiServer.port="+c.APIServerPort(),
		"--set", "nodeSelector.kpr\\.io/proxy=kpr")
	for _, n := range c.nodes {
		// 1. kube-proxy's pod goes, its rules stay; 2. kpr's comes.
		o.step("label " + n.name + " kpr.io/proxy=kpr")
		o.run("kubectl", "label", "node", n.name, "kpr.io/proxy=kpr")
		o.waitPods("kube-system", "k8s-app=kube-proxy", n.name, 0)
		o.step("kube-proxy's pod is gone from " + n.name)
		o.waitPods("kpr-system", "k8s-app=kpr", n.name, 1)
		pod := o.podOn("kpr-system", "k8s-app=kpr", n.name)
		o.step("kpr's pod " + pod + " is ready on " + n.name)
		o.waitStatusSynced(pod)
		// 3. kube-proxy's leftovers, from the kpr pod (the node's network).
		o.step("kpr cleanup --kube-proxy on " + n.name)
		out := o.run("kubectl", "-n", "kpr-system", "exec", pod, "--", "kpr", "cleanup", "--kube-proxy")
		t.Logf("kpr cleanup --kube-proxy on %s:\n%s", n.name, out)
		o.check("migration of " + n.name + " from kube-proxy to kpr")
	}

	// A rolling update of kpr.
	o.run("helm", "upgrade", "kpr", chart, "--namespace", "kpr-system", "--reuse-values", "--set", "image.tag="+kprNextTag)
	o.rollout("kpr-system", "daemonset/kpr")
	o.check("rolling update of kpr")

	// A node's kpr pod deleted; the DaemonSet makes a new one.
	o.run("kubectl", "-n", "kpr-system", "delete", "pod", o.podOn("kpr-system", "k8s-app=kpr", c.nodes[1].name))
	o.rollout("kpr-system", "daemonset/kpr")
	o.waitPods("kpr-system", "k8s-app=kpr", c.nodes[1].name, 1)
	o.check("kpr pod deleted")

	// The backend scaled down (its pods terminate gracefully, serving for
	// 15 s while their endpoints are terminating) and up again.
	o.run("kubectl", "scale", "deployment/backend", "--replicas=1")
	o.waitEndpoints("backend", 1)
	o.check("backend scaled down to 1")
	o.run("kubectl", "scale", "deployment/backend", "--replicas=4")
	o.rollout("default", "deployment/backend")
	o.waitEndpoints("backend", 4)
	o.check("backend scaled up to 4")

	// docs/migration.md, "Rollback, node by node", then the chart's
	// uninstall (deploy/README.md): the cleanup DaemonSet, then helm
	// uninstall.
	for _, n := range c.nodes {
		o.run("kubectl", "label", "node", n.name, "kpr.io/proxy-")
		o.waitPods("kpr-system", "k8s-app=kpr", n.name, 0)
		o.waitPods("kube-system", "k8s-app=kube-proxy", n.name, 1)
		o.rollout("kube-system", "daemonset/kube-proxy")
		o.check("rollback of " + n.name + " to kube-proxy")
	}
	o.run("helm", "upgrade", "kpr", chart, "--namespace", "kpr-system", "--reuse-values", "--set", "cleanup.enabled=true")
	o.rollout("kpr-system", "daemonset/kpr-cleanup")
	o.run("helm", "uninstall", "kpr", "--namespace", "kpr-system")
	o.check("kpr's uninstall")
	o.stopOutside()
}

// operations holds what TestOperations' steps share.
type operations struct {
	t   *testing.T
	ctx context.Context
	c   *Cluster

	outside *Traffic
	// answered is the client pod's count at the last check.
	answered int
}

// step logs the time an action starts, so that a failure the client
// reports with its time can be put next to it.
func (o *operations) step(what string) {
	o.t.Logf("%s %s", time.Now().Format("15:04:05"), what)
}

func (o *operations) run(tool string, args ...string) string {
	o.t.Helper()
	out, err := o.c.Run(o.ctx, tool, args...)
	if err != nil {
		o.t.Fatal(err)
	}
	return out
}

func (o *operations) rollout(namespace, workload string) {
	o.t.Helper()
	if err := o.c.WaitRollout(o.ctx, namespace, workload, 10*time.Minute); err != nil {
		o.t.Fatal(err)
	}
}

// apply applies manifests with kubectl.
func (o *operations) apply(manifests string) {
	o.t.Helper()
	path := filepath.Join(o.t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(path, []byte(manifests), 0o644); err != nil {
		o.t.Fatal(err)
	}
	o.run("kubectl", "apply", "-f", path)
}

func (o *operations) nodePort(service string) int32 {
	o.t.Helper()
	svc, err := o.c.Client.CoreV1().Services("default").Get(o.ctx, service, metav1.GetOptions{})
	if err != nil {
		o.t.Fatal(err)
	}
	return svc.Spec.Ports[0].NodePort
}

// pods lists the running, not terminating, pods of selector on node.
func (o *operations) pods(namespace, selector, node string) []string {
	o.t.Helper()
	list, err := o.c.Client.CoreV1().Pods(namespace).List(o.ctx, metav1.ListOptions{
		LabelSelector: selector, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		o.t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	return names
}

// waitPods waits until node has want pods of selector, and none
// terminating when want is 0.
func (o *operations) waitPods(namespace, selector, node string, want int) {
	o.t.Helper()
	o.poll(fmt.Sprintf("%d pods %s on %s", want, selector, node), func() bool {
		list, err := o.c.Client.CoreV1().Pods(namespace).List(o.ctx, metav1.ListOptions{
			LabelSelector: selector, FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false
		}
		if want == 0 {
			return len(list.Items) == 0
		}
		ready := 0
		for _, p := range list.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == "Ready" && cond.Status == "True" && p.DeletionTimestamp == nil {
					ready++
				}
			}
		}
		return ready == want
	})
}

func (o *operations) podOn(namespace, selector, node string) string {
	o.t.Helper()
	names := o.pods(namespace, selector, node)
	if len(names) != 1 {
		o.t.Fatalf("pods %s on %s: %v, want one", selector, node, names)
	}
	return names[0]
}

// waitStatusSynced waits until kpr status in pod reports a successful sync,
// as docs/migration.md's step 2 says to.
func (o *operations) waitStatusSynced(pod string) {
	o.t.Helper()
	o.poll("kpr status of "+pod+" reports a sync", func() bool {
		out, err := o.c.Run(o.ctx, "kubectl", "-n", "kpr-system", "exec", pod, "--", "kpr", "status")
		return err == nil && statusSynced.MatchString(out) && !strings.Contains(out, "NOT CONNECTED")
	})
}

// waitEndpoints waits until the Service's EndpointSlices list want ready
// endpoints and no other.
func (o *operations) waitEndpoints(service string, want int) {
	o.t.Helper()
	o.poll(fmt.Sprintf("%d endpoints of %s", want, service), func() bool {
		slices, err := o.c.Client.DiscoveryV1().EndpointSlices("default").List(o.ctx, metav1.ListOptions{
			LabelSelector: "kubernetes.io/service-name=" + service})
		if err != nil {
			return false
		}
		n := 0
		for _, s := range slices.Items {
			n += len(s.Endpoints)
		}
		return n == want
	})
}

func (o *operations) poll(what string, done func() bool) {
	o.t.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			o.t.Fatalf("waiting for %s: not within 10m", what)
		}
		time.Sleep(2 * time.Second)
	}
}

func (o *operations) startOutside(urls []string) {
	o.t.Helper()
	tr, err := o.c.StartTraffic(urls, 10*time.Millisecond)
	if err != nil {
		o.t.Fatal(err)
	}
	o.outside = tr
	o.t.Cleanup(func() { tr.Stop() })
}

func (o *operations) stopOutside() {
	o.t.Helper()
	tally := o.outside.Stop()
	o.t.Logf("outside the nodes: %d NodePort requests over the whole test, %d failed, %d slower than %s",
		tally.Sent, len(tally.Failed), len(tally.Slow), slowRequest)
}

// checkOutside reports the NodePort requests from outside the nodes since
// the last check: each phase fails on its own failures, and lists its slow
// answers (a dropped SYN sent again), which are not failures.
func (o *operations) checkOutside(phase string) {
	o.t.Helper()
	tally := o.outside.Take()
	o.t.Logf("%s: outside the nodes, %d NodePort requests, %d failed, %d slower than %s",
		phase, tally.Sent, len(tally.Failed), len(tally.Slow), slowRequest)
	if len(tally.Slow) > 0 {
		o.t.Logf("%s: slow NodePort answers: %s", phase, strings.Join(first(tally.Slow, 50), "; "))
	}
	if tally.Sent == 0 {
		o.t.Errorf("%s: no NodePort request from outside was sent", phase)
	}
	if len(tally.Failed) > 0 {
		o.t.Errorf("%s: %d of %d NodePort requests from outside failed: %s",
			phase, len(tally.Failed), tally.Sent, strings.Join(first(tally.Failed, 50), "; "))
	}
}

// statusSynced matches kpr status's line of a successful sync.
var statusSynced = regexp.MustCompile(`(?m)^sync:\s+last successful `)

// heldSilenceLimit is how many seconds a held connection may go without
// an echo before the check calls it stuck.
const heldSilenceLimit = 20

// heldAge matches a line of check's script: a held connection and the
// seconds since it last echoed.
var heldAge = regexp.MustCompile(`(?m)^/tmp/held-(\S+) (-?\d+)$`)

// check fails the test if, since the start, the client pod saw a request
// fail or a held connection end, or if it has stopped answering; phase
// names the operation that just ended.
func (o *operations) check(phase string) {
	o.t.Helper()
	o.t.Logf("%s: done at %s; checking after 30 s of traffic", phase, time.Now().Format("15:04:05"))
	// Half a minute of traffic after the operation, so that a late effect
	// (a pod's grace period, a sync) falls into its phase.
	time.Sleep(30 * time.Second)
	logs := o.run("kubectl", "logs", "deployment/client")
	var failures []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.HasPrefix(line, "FAIL ") || strings.HasPrefix(line, "BROKEN ") {
			failures = append(failures, line)
		}
	}
	state := o.run("kubectl", "exec", "deployment/client", "--", "sh", "-c",
		`cat /tmp/answered; now=$(date +%s); for f in /tmp/held-*; do [ -s "$f" ] && echo "$f $((now - $(cat "$f")))"; done; true`)
	answered, err := strconv.Atoi(strings.SplitN(strings.TrimSpace(state), "\n", 2)[0])
	if err != nil {
		o.t.Fatalf("%s: the client's state: %q", phase, state)
	}
	held := heldAge.FindAllStringSubmatch(state, -1)
	o.checkOutside(phase)
	o.t.Logf("%s: the client pod has %d answers (%d since the last check), %d held connections, %d failures",
		phase, answered, answered-o.answered, len(held), len(failures))
	if answered <= o.answered {
		o.t.Errorf("%s: the client pod got no answer since the last check", phase)
	}
	o.answered = answered
	if len(held) != 4 {
		o.t.Errorf("%s: %d held connections echo, want 4:\n%s\nthe client's log:\n%s", phase, len(held), state, logs)
	}
	for _, h := range held {
		// Generous: the emulated nodes can stall a healthy connection for
		// seconds; a broken one stays silent for good.
		if age, _ := strconv.Atoi(h[2]); age > heldSilenceLimit {
			o.t.Errorf("%s: held connection %s last echoed %d s ago", phase, h[1], age)
		}
	}
	if len(failures) > 0 {
		o.t.Fatalf("%s: the client pod reports:\n%s", phase, strings.Join(first(failures, 20), "\n"))
	}
}
