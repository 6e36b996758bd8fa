package apiclient

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Scheme holds the API types kpr's clients decode: core/v1 (Services,
// Nodes, Events, Pods), discovery/v1 (EndpointSlices) and node/v1
// (RuntimeClasses).
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(discoveryv1.AddToScheme(s))
	utilruntime.Must(nodev1.AddToScheme(s))
	return s
}()

// Clients are REST clients for the API groups kpr reads.
type Clients struct {
	Core      rest.Interface // core/v1, under /api
	Discovery rest.Interface // discovery.k8s.io/v1, under /apis
	Node      rest.Interface // node.k8s.io/v1 (RuntimeClasses), under /apis
	// cfg is what they were built from, for Trimmed.
	cfg *rest.Config
}

// Connection says how kpr reaches the API server: kube-proxy's
// clientConnection settings and its --master.
type Connection struct {
	// Kubeconfig is a kubeconfig file; empty means the Pod's
	// ServiceAccount (the in-cluster configuration).
	Kubeconfig string
	// Master is the API server's address, host:port or a URL, in place
	// of the kubeconfig's server or of the in-cluster address. A node
	// whose Service translation is kpr itself needs it (or an
	// overriding KUBERNETES_SERVICE_HOST and _PORT): the "kubernetes"
	// Service's ClusterIP only works once kpr has synced, which it
	// cannot do through that ClusterIP.
	Master string
	// QPS and Burst limit the request rate; zero keeps client-go's
	// defaults (5 and 10, kube-proxy's too).
	QPS   float32
	Burst int
	// ContentType is the encoding of requests; empty means protobuf.
	ContentType string
}

// serviceAccountDir holds the Pod's ServiceAccount token and the
// cluster's CA, where the kubelet mounts them (and where client-go's
// in-cluster configuration reads them). A variable so tests can point it
// at files of their own.
var serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// New returns the clients for c.
func New(c Connection) (*Clients, error) {
	cfg, err := RESTConfig(c)
	if err != nil {
		return nil, err
	}
	return ForConfig(cfg)
}

// RESTConfig builds the client configuration for c: the kubeconfig with
// its server replaced by Master, or the ServiceAccount's credentials with
// Master as the address, or, with neither, client-go's in-cluster
// configuration (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, which
// a DaemonSet may set to the API server's own address).
func RESTConfig(c Connection) (*rest.Config, error) {
	master := c.Master
	if master != "" && !strings.Contains(master, "://") {
		master = "https://" + master
	}
	var cfg *rest.Config
	var err error
	switch {
	case c.Kubeconfig != "":
		if cfg, err = clientcmd.BuildConfigFromFlags(master, c.Kubeconfig); err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", c.Kubeconfig, err)
		}
	case master != "":
		if cfg, err = serviceAccountConfig(master); err != nil {
			return nil, err
		}
	default:
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no --kubeconfig or --master given and not running in a cluster: %w", err)
		}
	}
	if c.QPS != 0 {
		cfg.QPS = c.QPS
	}
	if c.Burst != 0 {
		cfg.Burst = c.Burst
	}
	switch c.ContentType {
	case "":
	case runtime.ContentTypeJSON, runtime.ContentTypeProtobuf:
		cfg.ContentType = c.ContentType
	default:
		return nil, fmt.Errorf("content type %q: want %s or %s", c.ContentType, runtime.ContentTypeProtobuf, runtime.ContentTypeJSON)
	}
	return cfg, nil
}

// serviceAccountConfig is the in-cluster configuration with host in place
// of the address the environment names: the ServiceAccount's token (read
// again as the kubelet rotates it) and the cluster's CA.
func serviceAccountConfig(host string) (*rest.Config, error) {
	token := filepath.Join(serviceAccountDir, corev1.ServiceAccountTokenKey)
	ca := filepath.Join(serviceAccountDir, corev1.ServiceAccountRootCAKey)
	for _, f := range []string{token, ca} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("--master without --kubeconfig authenticates as the Pod's ServiceAccount, "+
				"but its credentials are missing (give --kubeconfig outside a Pod): %w", err)
		}
	}
	return &rest.Config{
		Host:            host,
		BearerTokenFile: token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
	}, nil
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
	// A configuration that asks for JSON (kube-proxy's --kube-api-content-type)
	// gets JSON both ways.
	if cfg.ContentType == "" {
		cfg.ContentType = runtime.ContentTypeProtobuf
	}
	if cfg.AcceptContentTypes == "" {
		cfg.AcceptContentTypes = cfg.ContentType
		if cfg.ContentType != runtime.ContentTypeJSON {
			cfg.AcceptContentTypes += "," + runtime.ContentTypeJSON
		}
	}
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
	node, err := forGroup(nodev1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &Clients{Core: core, Discovery: discovery, Node: node, cfg: rest.CopyConfig(orig)}, nil
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
