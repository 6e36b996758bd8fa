package apiclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- cluster:
    server: https://kubernetes.default.svc:443
    insecure-skip-tls-verify: true
  name: default
contexts:
- context: {cluster: default, user: default}
  name: default
current-context: default
users:
- name: default
  user: {token: abc}
`

func TestRESTConfigMasterReplacesTheKubeconfigServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := RESTConfig(Connection{Kubeconfig: path, Master: "10.0.0.1:6443", QPS: 20, Burst: 40, ContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://10.0.0.1:6443" || cfg.BearerToken != "abc" || cfg.QPS != 20 || cfg.Burst != 40 || cfg.ContentType != "application/json" {
		t.Errorf("config = host %q token %q qps %v burst %d content %q", cfg.Host, cfg.BearerToken, cfg.QPS, cfg.Burst, cfg.ContentType)
	}
	cfg, err = RESTConfig(Connection{Kubeconfig: path})
	if err != nil || cfg.Host != "https://kubernetes.default.svc:443" || cfg.QPS != 0 {
		t.Errorf("without --master: host %q qps %v err %v, want the kubeconfig's server and client-go's default rate", cfg.Host, cfg.QPS, err)
	}
	if _, err := RESTConfig(Connection{Kubeconfig: path, ContentType: "text/plain"}); err == nil {
		t.Error("an unknown content type was accepted")
	}
}

func TestRESTConfigMasterWithTheServiceAccount(t *testing.T) {
	dir := t.TempDir()
	old := serviceAccountDir
	serviceAccountDir = dir
	defer func() { serviceAccountDir = old }()
	// The environment points at the kubernetes Service, which nothing
	// translates yet on a node whose Service proxy is kpr.
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if _, err := RESTConfig(Connection{Master: "192.0.2.10:6443"}); err == nil || !strings.Contains(err.Error(), "ServiceAccount") {
		t.Fatalf("without credentials: %v, want an error naming the ServiceAccount", err)
	}
	for _, f := range []string{"token", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := RESTConfig(Connection{Master: "192.0.2.10:6443"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://192.0.2.10:6443" || cfg.BearerTokenFile != filepath.Join(dir, "token") || cfg.TLSClientConfig.CAFile != filepath.Join(dir, "ca.crt") {
		t.Errorf("config = host %q token file %q CA %q", cfg.Host, cfg.BearerTokenFile, cfg.TLSClientConfig.CAFile)
	}
}

func TestForConfigAcceptHeader(t *testing.T) {
	accept := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept <- r.Header.Get("Accept")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","items":[]}`))
	}))
	defer srv.Close()
	for contentType, want := range map[string]string{
		"":                 "application/vnd.kubernetes.protobuf,application/json",
		"application/json": "application/json",
	} {
		cfg := &rest.Config{Host: srv.URL}
		cfg.ContentType = contentType
		c, err := ForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Core.Get().Resource("services").Do(context.Background()).Error(); err != nil {
			t.Fatal(err)
		}
		if got := <-accept; got != want {
			t.Errorf("content type %q: Accept %q, want %q", contentType, got, want)
		}
	}
}
