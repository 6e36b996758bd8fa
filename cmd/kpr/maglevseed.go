package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kpr-io/kpr/maps/maglev"
)

// The cluster's Maglev seed. Maglev needs every node to build the same
// tables and hash a flow alike, and the hash needs a secret so that an
// outsider cannot aim flows at one backend: one secret per cluster, that
// every node can read. --maglev-hash-seed gives it; without the flag it is
// the UID of the kube-system Namespace, which the API server draws at
// random when the cluster is created and which never changes, and which
// kpr's ServiceAccount may read (deploy/: get on that one Namespace).

// seedNamespace is the Namespace whose UID is the cluster's default seed.
const seedNamespace = "kube-system"

// seedReadTimeout bounds the read of seedNamespace at start-up; the
// client retries a refused connection meanwhile.
const seedReadTimeout = time.Minute

// resolveMaglevSeed sets f.maglevSeed for --lb-algorithm maglev, from
// --maglev-hash-seed or else from the UID core reads. A seed that cannot
// be read is an error, not a fallback: a node with another seed would
// send the flows an ECMP router gives it elsewhere than its peers do, and
// a fixed seed is one an outsider knows.
func (f *ebpfFlags) resolveMaglevSeed(ctx context.Context, core rest.Interface, log *zap.Logger) error {
	if f.lbAlgorithm != lbMaglev {
		return nil
	}
	if f.maglevHashSeed != "" {
		f.maglevSeed = maglev.SeedOf(f.maglevHashSeed)
		log.Info("Maglev hash seed from --maglev-hash-seed")
		return nil
	}
	uid, err := namespaceUID(ctx, core, seedNamespace)
	if err != nil {
		return fmt.Errorf("--lb-algorithm maglev needs the cluster's hash seed, the same on every node: reading the UID of Namespace %s: %w; "+
			"grant kpr's ServiceAccount get on that Namespace (deploy/ does), or give every node the same secret --maglev-hash-seed", seedNamespace, err)
	}
	f.maglevSeed = maglev.SeedOf(uid)
	log.Info("Maglev hash seed from the UID of Namespace "+seedNamespace, zap.String("namespace", seedNamespace))
	return nil
}

// namespaceUID reads the UID of Namespace name.
func namespaceUID(ctx context.Context, core rest.Interface, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, seedReadTimeout)
	defer cancel()
	var ns corev1.Namespace
	if err := core.Get().Resource("namespaces").Name(name).Do(ctx).Into(&ns); err != nil {
		return "", err
	}
	if ns.UID == "" {
		return "", errors.New("the API server gave it no UID")
	}
	return string(ns.UID), nil
}
