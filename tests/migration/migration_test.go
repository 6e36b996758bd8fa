package migration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/kprproc"
)

// settle is how long flows keep exchanging requests after each step, so a
// step that breaks them shows.
const settle = time.Second

// TestMigration follows docs/migration.md on one node, for kube-proxy in
// iptables and in nftables mode: flows opened through kube-proxy keep
// working while kube-proxy stops, kpr starts and `kpr cleanup
// --kube-proxy` removes kube-proxy's rules, and new connections then go
// through kpr; then the rollback, kube-proxy back and `kpr cleanup`, again
// with every flow, those opened through kube-proxy and through kpr,
// passing every request. nftables runs first: the iptables mode leaves the
// built-in nat chains of iptables-nft in the namespace, which would hide a
// cleanup that detaches NAT from established connections.
func TestMigration(t *testing.T) {
	f := newFixture(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) { f.migrate(t, mode) })
	}
}

func (f *fixture) migrate(t *testing.T, mode string) {
	f.t = t
	kp := f.startKubeProxy(mode)
	viaKubeProxy := f.openFlows("kube-proxy " + mode)
	since := mark(viaKubeProxy)

	// The steps of docs/migration.md. 1: kube-proxy stops; its rules stay
	// and serve.
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)
	// 2: kpr starts; new connections are translated by its socket
	// hooks before netfilter sees them.
	kpr := f.startKPR()
	time.Sleep(settle)
	// 3: kube-proxy's leftovers go.
	t.Logf("kpr cleanup --kube-proxy:\n%s", f.cleanupKubeProxy())
	time.Sleep(settle)

	if left := f.kubeProxyState(); len(left) > 0 {
		t.Fatalf("kube-proxy state left after the migration:\n%s", strings.Join(left, "\n"))
	}
	// With no kube-proxy rule left, only kpr can serve new connections;
	// its socket hooks count them.
	connects, sends := sockTranslations(t, kpr, "connect4"), sockTranslations(t, kpr, "sendmsg4")
	if err := f.checkNewConnections(); err != nil {
		t.Fatalf("new connections after the migration: %v\n%s", err, kpr.Log())
	}
	if d := sockTranslations(t, kpr, "connect4") - connects; d < 2 {
		t.Errorf("kpr's connect4 hook translated %v of the 2 new TCP connections", d)
	}
	if d := sockTranslations(t, kpr, "sendmsg4") - sends; d < 2 {
		t.Errorf("kpr's sendmsg4 hook translated %v of the 2 new UDP datagrams", d)
	}
	if svcs, err := kpr.Dump(); err != nil || len(svcs) == 0 {
		t.Fatalf("kpr dump after the migration: %v (%d frontends)", err, len(svcs))
	}
	f.checkNoFailures(t, viaKubeProxy, since)
	if t.Failed() {
		return
	}

	// The rollback: kube-proxy comes back while kpr still serves, then
	// kpr and its dataplane go.
	viaKPR := f.openFlows("kpr")
	since = mark(viaKubeProxy, viaKPR)
	kp = f.startKubeProxy(mode)
	f.waitKubeProxyRules(t, mode)
	time.Sleep(settle)
	if err := kpr.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)
	if out, err := f.inNode("nft", "list", "tables"); err != nil || strings.Contains(out, "kpr-keep-nat") {
		t.Errorf("kpr cleanup left its nftables table behind: %v\n%s", err, out)
	}
	if err := f.checkNewConnections(); err != nil {
		t.Fatalf("new connections after the rollback: %v\n%s", err, kp.LogTail())
	}
	f.checkNoFailures(t, viaKubeProxy, since)
	f.checkNoFailures(t, viaKPR, since)
	for _, fl := range append(viaKubeProxy, viaKPR...) {
		ok, _, _ := fl.counts()
		t.Logf("%s: %d requests", fl.name, ok)
		_ = fl.finish()
	}

	// The next mode starts from a node without kube-proxy state.
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	f.cleanupKubeProxy()
}

// sockTranslations is kpr's count of translations by one socket hook.
func sockTranslations(t *testing.T, kpr *kprproc.Process, hook string) float64 {
	t.Helper()
	v, err := kpr.Metric(`kpr_sock_translations_total{hook="` + hook + `"}`)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("kpr_sock_translations_total{hook=%q} = %q: %v", hook, v, err)
	}
	return n
}

// waitKubeProxyRules waits until kube-proxy has written the Service's
// rules (while kpr serves, a working connection does not show it).
func (f *fixture) waitKubeProxyRules(t *testing.T, mode string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out string
		var err error
		if mode == "iptables" {
			out, err = f.inNode("iptables-save", "-t", "nat")
		} else {
			out, err = f.inNode("nft", "list", "table", "ip", "kube-proxy")
		}
		if err == nil && strings.Contains(out, "default/migrate") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy (%s) wrote no rule for the Service in 30s: %v\n%s", mode, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMigrationToNFTablesMode follows docs/migration.md from kube-proxy's
// nftables mode to kpr's (as on a node where eBPF cannot run: forced
// with --mode nftables) and back: flows opened through kube-proxy, and
// then through kpr, pass every request while kube-proxy stops, kpr
// starts, `kpr cleanup --kube-proxy` removes kube-proxy's table, and in
// the rollback kube-proxy comes back and `kpr cleanup` removes kpr's.
func TestMigrationToNFTablesMode(t *testing.T) {
	f := newFixture(t)
	kp := f.startKubeProxy("nftables")
	viaKubeProxy := f.openFlows("kube-proxy nftables")
	since := mark(viaKubeProxy)

	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)
	kpr := f.startKPR("--mode", "nftables")
	time.Sleep(settle)
	t.Logf("kpr cleanup --kube-proxy:\n%s", f.cleanupKubeProxy())
	time.Sleep(settle)
	if left := f.kubeProxyState(); len(left) > 0 {
		t.Fatalf("kube-proxy state left after the migration:\n%s", strings.Join(left, "\n"))
	}
	if out, err := f.inNode("nft", "list", "table", "inet", "kpr"); err != nil || !strings.Contains(out, "default/migrate") {
		t.Fatalf("kpr's nftables table after the migration has no chain of the Service: %v\n%s", err, out)
	}
	if err := f.checkNewConnections(); err != nil {
		t.Fatalf("new connections after the migration: %v\n%s", err, kpr.Log())
	}
	f.checkNoFailures(t, viaKubeProxy, since)
	if t.Failed() {
		return
	}

	viaKPR := f.openFlows("kpr nftables")
	since = mark(viaKubeProxy, viaKPR)
	kp = f.startKubeProxy("nftables")
	f.waitKubeProxyRules(t, "nftables")
	time.Sleep(settle)
	if err := kpr.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)
	if out, err := f.inNode("nft", "list", "tables"); err != nil || strings.Contains(out, "table inet kpr\n") {
		t.Errorf("kpr cleanup left kpr's nftables table behind: %v\n%s", err, out)
	}
	if err := f.checkNewConnections(); err != nil {
		t.Fatalf("new connections after the rollback: %v\n%s", err, kp.LogTail())
	}
	f.checkNoFailures(t, viaKubeProxy, since)
	f.checkNoFailures(t, viaKPR, since)
	for _, fl := range append(viaKubeProxy, viaKPR...) {
		ok, _, _ := fl.counts()
		t.Logf("%s: %d requests", fl.name, ok)
		_ = fl.finish()
	}
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	f.cleanupKubeProxy()
}
