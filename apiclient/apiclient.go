// Package apiclient builds kpr's Kubernetes client.
package apiclient

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// New returns a client for kubeconfig, or for the in-cluster config when
// kubeconfig is empty. Its reads wait out a short API server outage (see
// reconnectTransport).
func New(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "kpr"
	// Protobuf, asked for explicitly as kube-proxy does, rather than left
	// to client-go's default: it is the cheaper encoding to decode for
	// the initial lists of a large cluster. JSON stays acceptable for
	// types without protobuf.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &reconnectTransport{next: rt, interval: 500 * time.Millisecond, max: 30 * time.Second}
	})
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build Kubernetes client: %w", err)
	}
	return client, nil
}

// reconnectTransport retries a GET whose connection was refused, every
// interval for up to max. client-go's informers back off exponentially
// after failed list and watch calls, up to 30-60 s by the end of a long
// API server outage, so without this kpr would notice a returning API
// server only that much later. Retrying here keeps each of their calls
// pending until the API server answers, and they resume within interval.
// Only GETs are retried: they carry no body and change nothing.
type reconnectTransport struct {
	next          http.RoundTripper
	interval, max time.Duration
}

func (t *reconnectTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		return t.next.RoundTrip(req)
	}
	giveUp := time.Now().Add(t.max)
	for {
		resp, err := t.next.RoundTrip(req)
		if err == nil || !connectFailed(err) || time.Now().After(giveUp) {
			return resp, err
		}
		select {
		case <-req.Context().Done():
			return nil, err
		case <-time.After(t.interval):
		}
	}
}

// connectFailed reports errors that mean the request never reached the
// API server, so sending it again is safe.
func connectFailed(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &op) && op.Op == "dial")
}
