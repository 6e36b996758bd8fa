package apiclient

import (
	"io"
	"net"
	"net/http"
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
