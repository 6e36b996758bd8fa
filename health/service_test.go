package health

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func freePort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

func probeServicePort(t *testing.T, port int32) (int, serviceResponse) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body serviceResponse
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func TestAnswersByLocalEndpointsAndProxyHealth(t *testing.T) {
	healthy := true
	s := NewServiceServer("127.0.0.1", func() bool { return healthy }, nil)
	t.Cleanup(s.Close)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	port := freePort(t)

	s.SyncServices(map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 2}})
	code, body := probeServicePort(t, port)
	if code != http.StatusOK || body.LocalEndpoints != 2 || body.Service.Name != "web" || !body.ServiceProxyHealthy {
		t.Fatalf("with local endpoints: %d %+v", code, body)
	}

	s.SyncServices(map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 0}})
	if code, body := probeServicePort(t, port); code != http.StatusServiceUnavailable || body.LocalEndpoints != 0 {
		t.Fatalf("without local endpoints: %d %+v", code, body)
	}

	s.SyncServices(map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 1}})
	healthy = false
	if code, body := probeServicePort(t, port); code != http.StatusServiceUnavailable || body.ServiceProxyHealthy {
		t.Fatalf("with an unhealthy proxy: %d %+v", code, body)
	}
}

func TestPortsFollowTheServices(t *testing.T) {
	s := NewServiceServer("127.0.0.1", nil, nil)
	t.Cleanup(s.Close)
	a := types.NamespacedName{Namespace: "default", Name: "a"}
	portA, portB := freePort(t), freePort(t)
	s.SyncServices(map[types.NamespacedName]Service{a: {Port: portA, LocalEndpoints: 1}})
	if code, _ := probeServicePort(t, portA); code != http.StatusOK {
		t.Fatalf("port A answered %d", code)
	}
	// The Service moves to another port: the old one must close.
	s.SyncServices(map[types.NamespacedName]Service{a: {Port: portB, LocalEndpoints: 1}})
	if code, _ := probeServicePort(t, portB); code != http.StatusOK {
		t.Fatalf("port B answered %d", code)
	}
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", portA)); err == nil {
		t.Fatal("the old port still answers")
	}
	s.SyncServices(nil)
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", portB)); err == nil {
		t.Fatal("a deleted Service's port still answers")
	}
}
