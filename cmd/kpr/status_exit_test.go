package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/watcher"
)

// fakeDaemon serves d at /kpr/status on a loopback port, as a running kpr
// does on its metrics address, and returns the address.
func fakeDaemon(t *testing.T, d daemonStatus) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != daemonStatusPath {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(d)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// healthyDaemon is a daemon that synced a second ago and hears from the
// API server.
func healthyDaemon() daemonStatus {
	now := time.Now()
	return daemonStatus{Version: "test", PID: 1, Mode: "ebpf", StartedAt: now.Add(-time.Minute),
		Watcher: watcher.Status{
			LastSuccessfulSync: &watcher.SyncStatus{At: now.Add(-time.Second)},
			API:                watcher.APIStatus{Connected: true, LastHeard: &now},
		}}
}

// noState is a mode table whose one mode finds no state on the node.
func noState(t *testing.T) {
	fakeModes(t, mode{backend: "a", inspect: func(dataplaneAt) (dataplane.Inspector, error) { return nil, leftovers.ErrNotRecorded }})
}

// kpr status ends with 0 only for a running, healthy kpr: 3 when none
// answers, 4 for each way a running one is unhealthy; in every output
// format, which prints the same report.
func TestStatusExitCodes(t *testing.T) {
	noState(t)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // nothing listens there now
	notKpr := httptest.NewServer(http.NotFoundHandler())
	defer notKpr.Close()
	for name, c := range map[string]struct {
		addr string
		want int
		says string
	}{
		"healthy":     {fakeDaemon(t, healthyDaemon()), exitOK, "health:   healthy"},
		"not running": {strings.TrimPrefix(down.URL, "http://"), exitNotRunning, "daemon:   NOT RUNNING"},
		"not kpr":     {strings.TrimPrefix(notKpr.URL, "http://"), exitNotRunning, "is that kpr"},
		"syncs behind": {fakeDaemon(t, func() daemonStatus { d := healthyDaemon(); d.SyncsBehind = true; return d }()),
			exitUnhealthy, "UNHEALTHY: a change has waited longer than 2 x --sync-period"},
		"no sync yet": {fakeDaemon(t, func() daemonStatus { d := healthyDaemon(); d.Watcher.LastSuccessfulSync = nil; return d }()),
			exitUnhealthy, "UNHEALTHY: no sync has succeeded yet"},
		"API unreachable": {fakeDaemon(t, func() daemonStatus {
			d := healthyDaemon()
			since := time.Now().Add(-time.Minute)
			d.Watcher.API = watcher.APIStatus{DisconnectedSince: &since, LastError: "connection refused"}
			return d
		}()), exitUnhealthy, "UNHEALTHY: the API server is unreachable: connection refused"},
		"watches stuck": {fakeDaemon(t, func() daemonStatus { d := healthyDaemon(); d.Watcher.API.Stuck = true; return d }()),
			exitUnhealthy, "UNHEALTHY: the watches are stuck"},
	} {
		for _, format := range []string{"table", "json", "yaml"} {
			out, errOut, code := runKpr(t, "status", "--metrics-address", c.addr, "--bpf-root", t.TempDir(), "-o", format)
			if code != c.want {
				t.Errorf("%s, -o %s: exit %d, want %d\n%s%s", name, format, code, c.want, out, errOut)
			}
			if format == "table" && !strings.Contains(out, c.says) {
				t.Errorf("%s: the status lacks %q:\n%s", name, c.says, out)
			}
		}
	}
}

// -o yaml is -o json's fields: the same document, in YAML.
func TestStatusYAMLIsTheJSON(t *testing.T) {
	noState(t)
	addr := fakeDaemon(t, func() daemonStatus { d := healthyDaemon(); d.Watcher.API.Stuck = true; return d }())
	bpfRoot := t.TempDir()
	j, _, _ := runKpr(t, "status", "--metrics-address", addr, "--bpf-root", bpfRoot, "-o", "json")
	y, _, _ := runKpr(t, "status", "--metrics-address", addr, "--bpf-root", bpfRoot, "-o", "yaml")
	var fromJSON, fromYAML map[string]any
	if err := json.Unmarshal([]byte(j), &fromJSON); err != nil {
		t.Fatalf("-o json: %v\n%s", err, j)
	}
	if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil {
		t.Fatalf("-o yaml: %v\n%s", err, y)
	}
	if !strings.Contains("\n"+y, "\nbpfRoot: "+bpfRoot+"\n") {
		t.Errorf("-o yaml is not YAML's block style:\n%s", y)
	}
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Errorf("-o yaml differs from -o json:\n%s\n%s", y, j)
	}
	if problems, _ := fromYAML["problems"].([]any); len(problems) != 1 || !strings.HasPrefix(fmt.Sprint(problems[0]), "the watches are stuck") {
		t.Errorf("-o yaml: problems %v, want the stuck watches\n%s", fromYAML["problems"], y)
	}
}

// Without privilege, a state the kernel refuses to show is reported as
// such, with exit 6, not as "no dataplane" and "none pinned"; a healthy
// daemon's part is still shown. With privilege the same refusal is a
// policy, reported as it is.
func TestStatusSaysItNeedsRoot(t *testing.T) {
	fakeModes(t, mode{backend: "a",
		inspect: func(at dataplaneAt) (dataplane.Inspector, error) {
			return nil, fmt.Errorf("open pinned map kpr_services under %s: %w", at.bpfRoot, unix.EACCES)
		},
		attached: func(at dataplaneAt) dataplane.Inspection {
			return dataplane.Inspection{Key: "links", Title: "links under " + at.bpfRoot, None: "(none pinned)"}
		}})
	addr := fakeDaemon(t, healthyDaemon())

	st := collectStatus(t.Context(), "/sys/fs/bpf/kpr", addr, "", false)
	err := st.verdict()
	if exitCodeOf(nil, err) != exitNeedsRoot || !strings.Contains(st.DataplaneError, "kpr status needs root (or CAP_BPF) to read kpr's state under /sys/fs/bpf/kpr; run it with sudo") {
		t.Errorf("unprivileged: verdict %v, dataplane error %q; want exit 6 and the reason", err, st.DataplaneError)
	}
	var b strings.Builder
	writeStatus(&b, st, time.Now())
	if strings.Contains(b.String(), "none pinned") || !strings.Contains(b.String(), "health:   healthy") {
		t.Errorf("unprivileged: the status shows what it could not read as absent, or omits the daemon:\n%s", b.String())
	}

	st = collectStatus(t.Context(), "/sys/fs/bpf/kpr", addr, "", true)
	if err := st.verdict(); err != nil || len(st.Attached) != 1 || strings.Contains(st.DataplaneError, "needs root") {
		t.Errorf("privileged: verdict %v, links %v, dataplane error %q; want 0, the links read, the kernel's refusal as it is", err, st.Attached, st.DataplaneError)
	}
}
