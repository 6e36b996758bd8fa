// Command testcluster runs kpr's test control plane (etcd and
// kube-apiserver, see package tests/cluster) until SIGINT or SIGTERM, for
// demos and manual runs of `kpr run --kubeconfig`.
//
//	go run ./tests/cluster/cmd/testcluster -kubeconfig /tmp/kpr.kubeconfig
//
// The kubeconfig is written to the given path and printed on stdout once the
// API server is ready; logs go to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/tests/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig   = flag.String("kubeconfig", "", "write the admin kubeconfig to this path (required)")
		serviceCIDRs = flag.String("service-cluster-ip-range", cluster.DefaultServiceClusterIPRange, "Service CIDRs, comma separated")
		netNS        = flag.String("netns", "", "run etcd and kube-apiserver in network namespace /run/netns/NAME")
		advertise    = flag.String("advertise-address", "", "kube-apiserver --advertise-address (required with -netns)")
		nodes        = flag.String("nodes", "", "Node objects to create, as name=ip[,ip...] separated by ';'")
	)
	flag.Parse()
	if *kubeconfig == "" {
		return errors.New("-kubeconfig is required")
	}

	log, err := zap.NewDevelopment()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := cluster.Start(ctx, cluster.Options{
		ServiceClusterIPRange: *serviceCIDRs,
		NetNS:                 *netNS,
		AdvertiseAddress:      *advertise,
		Logger:                log,
	})
	if err != nil {
		return err
	}
	// Stop runs on every path from here, including a failed node creation,
	// so no etcd or kube-apiserver outlives this process.
	defer func() {
		if err := c.Stop(); err != nil {
			log.Error("stopping the test cluster", zap.Error(err))
		}
	}()

	if err := createNodes(ctx, c, *nodes); err != nil {
		return err
	}
	data, err := os.ReadFile(c.KubeconfigPath)
	if err != nil {
		return fmt.Errorf("reading the generated kubeconfig: %w", err)
	}
	if err := os.WriteFile(*kubeconfig, data, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	fmt.Printf("%s", data)
	log.Info("test cluster ready; stop it with SIGINT or SIGTERM", zap.String("kubeconfig", *kubeconfig))

	<-ctx.Done()
	log.Info("stopping the test cluster")
	return nil
}

// createNodes parses "name=ip,ip;name2=ip" and creates those Nodes.
func createNodes(ctx context.Context, c *cluster.Cluster, spec string) error {
	for _, entry := range strings.Split(spec, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, addrs, ok := strings.Cut(entry, "=")
		if !ok || name == "" || addrs == "" {
			return fmt.Errorf("-nodes entry %q: want name=ip[,ip...]", entry)
		}
		if err := c.CreateNode(ctx, name, strings.Split(addrs, ","), nil); err != nil {
			return err
		}
	}
	return nil
}
