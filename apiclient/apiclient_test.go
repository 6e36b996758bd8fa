package apiclient

import (
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestGetWaitsForARefusingServerToReturn(t *testing.T) {
	// Find a free port, then leave it closed: connects are refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	rt := &reconnectTransport{next: http.DefaultTransport, interval: 50 * time.Millisecond, max: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the GET gave up while the server was away: %v", err)
	default:
	}
	// The server comes back on the same port.
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
	go srv.Serve(l)
	defer srv.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("GET after the server returned: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the GET did not resume after the server returned")
	}
}

func TestWritesAreNotRetried(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	rt := &reconnectTransport{next: http.DefaultTransport, interval: 50 * time.Millisecond, max: 10 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", nil)
	start := time.Now()
	if _, err := rt.RoundTrip(req); err == nil {
		t.Fatal("a POST to a closed port succeeded")
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("a POST was retried")
	}
}

// kpr's binary links only the API groups it reads. client-go's clientset,
// typed clients and kubernetes/scheme register every group, which adds
// their types to the binary and to its resident memory (see the package
// comment); an events recorder, for one, can use Scheme and Clients.Core.
func TestKprLinksOnlyTheAPIGroupsItReads(t *testing.T) {
	allowed := map[string]bool{
		"k8s.io/api/core/v1":      true, // Services, Nodes, Events
		"k8s.io/api/discovery/v1": true, // EndpointSlices
		"k8s.io/api/node/v1":      true, // RuntimeClasses (--socket-lb per-pod)
		"k8s.io/api/events/v1":    true, // events.k8s.io Events, should kpr post those
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/kpr-io/kpr/cmd/kpr").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/kpr: %v\n%s", err, out)
	}
	var extra []string
	for _, pkg := range strings.Fields(string(out)) {
		if (strings.HasPrefix(pkg, "k8s.io/api/") && !allowed[pkg]) || pkg == "k8s.io/client-go/kubernetes/scheme" {
			extra = append(extra, pkg)
		}
	}
	if len(extra) > 0 {
		t.Fatalf("kpr links %d packages of API groups it does not read, or client-go's all-groups scheme: %v\n"+
			"build clients on apiclient.Scheme instead of client-go's clientset or typed clients", len(extra), extra)
	}
}
