package apiclient

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// New returns a client for kubeconfig, or for the in-cluster config when
// kubeconfig is empty. Its reads wait out a short API server outage (see
// reconnectTransport).
// Scheme holds the API types kpr's clients decode: core/v1 (Services,
// Nodes, Events) and discovery/v1 (EndpointSlices).
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(discoveryv1.AddToScheme(s))
	return s
}()

// Clients are REST clients for the two API groups kpr reads.
type Clients struct {
	Core      rest.Interface // core/v1, under /api
	Discovery rest.Interface // discovery.k8s.io/v1, under /apis
	// cfg is what they were built from, for Trimmed.
	cfg *rest.Config
}

// New returns the clients for kubeconfig, or for the in-cluster config
// when kubeconfig is empty.
func New(kubeconfig string) (*Clients, error) {
	var cfg *rest.Config
	var err error
	switch {
	case kubeconfig == "":
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
		}
	default:
		if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
		}
	}
	return ForConfig(cfg)
}

// ForConfig returns the clients for cfg (which it does not modify). Their
// reads wait out a short API server outage (see reconnectTransport).
func ForConfig(cfg *rest.Config) (*Clients, error) {
	return forConfig(cfg, func(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer { return ns })
}

// forConfig is ForConfig with the serializers that serializers returns
// in place of the scheme's.
func forConfig(cfg *rest.Config, serializers func(runtime.NegotiatedSerializer) runtime.NegotiatedSerializer) (*Clients, error) {
	orig := cfg
	cfg = rest.CopyConfig(cfg)
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
	codecs := serializer.NewCodecFactory(Scheme)
	forGroup := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = serializers(codecs.WithoutConversion())
		client, err := rest.RESTClientFor(c)
		if err != nil {
			return nil, fmt.Errorf("build the Kubernetes client for %s: %w", gv, err)
		}
		return client, nil
	}
	core, err := forGroup(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	discovery, err := forGroup(discoveryv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &Clients{Core: core, Discovery: discovery, cfg: rest.CopyConfig(orig)}, nil
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
