package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
)

// certLifetime is how long the certificates are valid: far longer than any
// test or testcluster session.
const certLifetime = 365 * 24 * time.Hour

// pki is a cluster's key material, made once per cluster so that a restarted
// API server serves the same certificate and accepts the same clients.
//
// One CA signs both the API server's serving certificate and the admin's
// client certificate; the API server trusts it for clients through
// --client-ca-file, and the certificate's organization system:masters makes
// the admin a superuser under RBAC. The service-account key only has to
// exist: the API server refuses to start without one, and nothing in these
// clusters mints tokens.
type pki struct {
	dir string
	// ca signs the client certificates IssueClientCert makes later.
	ca *certPair
	// PEM data for the admin's rest.Config and kubeconfig.
	caCert, adminCert, adminKey []byte
}

// The files newPKI writes into its directory, for the API server's flags.
const (
	caCertFile      = "ca.crt"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	// The API server accepts a private key for --service-account-key-file
	// (it takes the public half), so one file serves both SA flags.
	serviceAccountKeyFile = "sa.key"
	// The API server's client certificate for kubelets (logs, exec,
	// port-forward, proxy), where a cluster has them.
	kubeletClientCertFile = "apiserver-kubelet-client.crt"
	kubeletClientKeyFile  = "apiserver-kubelet-client.key"
)

// newPKI makes the cluster's CA, the API server's serving certificate (for
// localhost and loopback, and for servingIPs and servingNames, the names
// clients outside the host's loopback reach it by), the admin's client
// certificate and the service-account key.
func newPKI(dir string, servingIPs []net.IP, servingNames []string) (*pki, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the certificate directory: %w", err)
	}
	ca, err := issue(&x509.Certificate{
		Subject:               pkix.Name{CommonName: "kpr-testcluster-ca"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
	if err != nil {
		return nil, err
	}
	// Clients reach the API server on 127.0.0.1 (also through the netns
	// relay); clients elsewhere name it localhost (tls-server-name), or
	// use one of servingIPs and servingNames.
	serving, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    append([]string{"localhost"}, servingNames...),
		IPAddresses: append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, servingIPs...),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca)
	if err != nil {
		return nil, err
	}
	admin, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca)
	if err != nil {
		return nil, err
	}
	saKey, err := newKey()
	if err != nil {
		return nil, err
	}

	p := &pki{dir: dir, ca: ca, caCert: ca.certPEM(), adminCert: admin.certPEM()}
	if p.adminKey, err = keyPEM(admin.key); err != nil {
		return nil, err
	}
	servingKey, err := keyPEM(serving.key)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := keyPEM(saKey)
	if err != nil {
		return nil, err
	}
	// As kubeadm's: a superuser, so that kubelets that authorize through
	// the API server (webhook mode) allow it everything.
	kubeletClientCert, kubeletClientKey, err := p.issueClient("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{
		caCertFile:            p.caCert,
		servingCertFile:       serving.certPEM(),
		servingKeyFile:        servingKey,
		serviceAccountKeyFile: saKeyPEM,
		kubeletClientCertFile: kubeletClientCert,
		kubeletClientKeyFile:  kubeletClientKey,
	} {
		if err := os.WriteFile(p.path(name), data, 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return p, nil
}

// path is where the file name (one of the constants above) lives.
func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// adminConfig is a rest.Config for the admin on the API server at host.
func (p *pki) adminConfig(host string) *rest.Config {
	return &rest.Config{
		Host: host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: p.caCert, CertData: p.adminCert, KeyData: p.adminKey,
		},
		// Tests create objects in bursts that client-go's default of 5
		// requests a second would throttle for minutes.
		QPS:   1000,
		Burst: 2000,
	}
}

// issueClient makes a client certificate and key (PEM) for the user cn in
// the groups orgs, signed by the cluster's CA: a kubelet's is
// system:node:NAME in system:nodes, which the Node authorizer admits.
func (p *pki) issueClient(cn string, orgs ...string) (cert, key []byte, err error) {
	pair, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, p.ca)
	if err != nil {
		return nil, nil, err
	}
	if key, err = keyPEM(pair.key); err != nil {
		return nil, nil, err
	}
	return pair.certPEM(), key, nil
}

// certPair is a certificate and its private key.
type certPair struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// issue makes a new key and a certificate for it from tmpl, signed by
// parent, or by itself if parent is nil.
func issue(tmpl *x509.Certificate, parent *certPair) (*certPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)); err != nil {
		return nil, fmt.Errorf("making a serial number: %w", err)
	}
	tmpl.NotBefore = time.Now().Add(-time.Minute)
	tmpl.NotAfter = tmpl.NotBefore.Add(certLifetime)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	return &certPair{cert: cert, key: key}, nil
}

func (p *certPair) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.cert.Raw})
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a key: %w", err)
	}
	return key, nil
}

// keyPEM encodes key as SEC 1 ("EC PRIVATE KEY"): --service-account-key-file
// reads EC private keys in that form only, not as PKCS #8.
func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding a private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
