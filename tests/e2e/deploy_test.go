package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/deploy"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// TestDeployBase checks deploy/base against a real API server: every
// manifest passes a server-side dry run, the ServiceAccount may do what
// kpr needs and nothing more, and kpr comes up on a node with empty maps
// through the in-cluster configuration, as the DaemonSet runs it.
func TestDeployBase(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, err := deploy.NewApplier(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	base := deploy.BaseDir()
	files, err := filepath.Glob(filepath.Join(base, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", base, err)
	}
	read := func(path string) []*unstructured.Unstructured {
		t.Helper()
		objs, err := deploy.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}

	// Every manifest file, as `kubectl apply -f` would send it. DryRunAll
	// creates the Namespace for real, which the subtests below need. The
	// ConfigMaps are not among them: kustomization.yaml generates them
	// (tests/deploy/kustomize renders and dry-runs the whole base).
	var objs []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" {
			objs = append(objs, read(f)...)
		}
	}
	dryRunErr := a.DryRunAll(ctx, objs)
	t.Run("every manifest passes a server-side dry run", func(t *testing.T) {
		if dryRunErr != nil {
			t.Fatal(dryRunErr)
		}
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[o.GetKind()]++
		}
		for kind, n := range map[string]int{"Namespace": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "DaemonSet": 1} {
			if kinds[kind] != n {
				t.Errorf("%d %s objects in deploy/base, want %d", kinds[kind], kind, n)
			}
		}
	})

	// From here on the ServiceAccount and its RBAC exist for real.
	for _, name := range []string{"serviceaccount.yaml", "rbac.yaml"} {
		for _, obj := range read(filepath.Join(base, name)) {
			if err := a.Create(ctx, obj, false); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("the ServiceAccount may do what kpr needs and no more", func(t *testing.T) {
		if err := deploy.CheckLeastPrivilege(ctx, c.Client, deploy.Namespace, deploy.ServiceAccount, true); err != nil {
			t.Error(err)
		}
	})

	t.Run("kpr comes up through the in-cluster configuration", func(t *testing.T) {
		harness.RequireRoot(t)
		tok, err := c.Client.CoreV1().ServiceAccounts(deploy.Namespace).CreateToken(ctx, deploy.ServiceAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		saDir := t.TempDir()
		if err := os.WriteFile(filepath.Join(saDir, "token"), []byte(tok.Status.Token), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(saDir, "ca.crt"), c.Config.CAData, 0o600); err != nil {
			t.Fatal(err)
		}
		api, err := url.Parse(c.Config.Host)
		if err != nil {
			t.Fatal(err)
		}
		apiHost, apiPort, err := net.SplitHostPort(api.Host)
		if err != nil {
			t.Fatal(err)
		}
		const node = "kpr-deploy-node"
		if err := c.CreateNode(ctx, node, []string{"192.168.77.20"}, nil); err != nil {
			t.Fatal(err)
		}
		// A closed port stands for the kubernetes Service's ClusterIP on a
		// node whose maps are empty: nothing answers there.
		unreachable := closedLoopbackPort(t)

		for _, tc := range []struct {
			name, host, port string
			args             []string
		}{
			// The DaemonSet's way: KUBERNETES_SERVICE_HOST and _PORT name
			// the API server itself.
			{"KUBERNETES_SERVICE_HOST names the API server", apiHost, apiPort, nil},
			// The environment still names the unreachable Service;
			// --master reaches the API server directly. kube-proxy
			// flags kpr has no use for are accepted, with a warning.
			{"--master bypasses the Service", "127.0.0.1", unreachable,
				[]string{"--master=" + api.Host, "--masquerade-all", "--oom-score-adj=-999"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cg, err := harness.NewCgroup(t)
				if err != nil {
					t.Fatal(err)
				}
				p, err := kprproc.Start(kprproc.Options{
					Binary:     inClusterWrapper(t, saDir, tc.host, tc.port),
					Kubeconfig: "", // the in-cluster configuration
					NodeName:   node,
					CgroupRoot: cg.Path,
					Args:       tc.args,
					LogPath:    filepath.Join(t.TempDir(), "kpr.log"),
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("kpr log (last 40 lines):\n%s", lastLines(p.Log(), 40))
					}
					if err := p.Cleanup(); err != nil {
						t.Errorf("kpr cleanup: %v", err)
					}
				})
				syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				if err := p.WaitSynced(syncCtx); err != nil {
					t.Fatal(err)
				}
				const warning = "kpr ignores these kube-proxy settings"
				if n := strings.Count(p.Log(), warning); len(tc.args) > 1 && n != 1 {
					t.Errorf("%d start-up warnings about kube-proxy settings, want one", n)
				}
				if len(tc.args) > 1 && !strings.Contains(p.Log(), "--oom-score-adj=-999") {
					t.Error("the start-up warning does not name --oom-score-adj")
				}
			})
		}
	})
}

// inClusterWrapper writes a script that runs kpr as a Pod would see the
// node: in a mount namespace of its own where the ServiceAccount's token
// and CA (copied from saDir) are at the kubelet's path, with
// KUBERNETES_SERVICE_HOST and _PORT set. The host's /run is left alone:
// the token directory lies on a tmpfs over /run in that namespace only.
func inClusterWrapper(t *testing.T, saDir, host, port string) string {
	t.Helper()
	kpr, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
export KUBERNETES_SERVICE_HOST=%q KUBERNETES_SERVICE_PORT=%q
exec unshare --mount --propagation private /bin/sh -c '
mount -t tmpfs kpr-test-run /run &&
mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
cp "$0/token" "$0/ca.crt" /run/secrets/kubernetes.io/serviceaccount/ &&
exec "$@"' %q %q "$@"
`, host, port, saDir, kpr)
	path := filepath.Join(t.TempDir(), "kpr-in-cluster")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedLoopbackPort returns a loopback port nothing listens on.
func closedLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}
