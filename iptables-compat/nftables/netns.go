package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/netnsexec"
)

// Open returns the knftables.Interface to kpr's table in the network
// namespace at netnsPath, the calling one's if empty; it is also the
// Plane's kernelReader there. It fails where nft cannot run or the
// kernel lacks nftables. knftables lists objects over netlink, as
// kube-proxy's does since 1.37: nft prints and parses the whole table
// for any list, which at 10,000 Services takes seconds.
func Open(netnsPath string) (knftables.Interface, error) {
	n := nodeNFT{path: netnsPath}
	err := n.do(func() error {
		var err error
		n.in, err = knftables.New(Family, TableName, knftables.UseNetlink)
		return err
	})
	if err != nil {
		if netnsPath != "" {
			return nil, fmt.Errorf("nftables in network namespace %s: %w", netnsPath, err)
		}
		return nil, err
	}
	return n, nil
}

// nodeNFT runs every call of in, and every read over netlink, inside the
// network namespace at path (the calling one if empty): nft is started,
// and netlink sockets are opened, from a thread inside it.
type nodeNFT struct {
	in   knftables.Interface
	path string
}

var _ kernelReader = nodeNFT{}

func (n nodeNFT) do(fn func() error) error {
	if n.path == "" {
		return fn()
	}
	return netnsexec.InPath(n.path, fn)
}

func (n nodeNFT) generation() (gen uint32, err error) {
	err = n.do(func() error { gen, err = netlinkReader{}.generation(); return err })
	return gen, err
}

func (n nodeNFT) tableObjects() (objects uint32, ok bool, err error) {
	err = n.do(func() error { objects, ok, err = netlinkReader{}.tableObjects(); return err })
	return objects, ok, err
}

func (n nodeNFT) ruleCounts(chains []string) (out map[string]int, err error) {
	err = n.do(func() error { out, err = netlinkReader{}.ruleCounts(chains); return err })
	return out, err
}

func (n nodeNFT) NewTransaction() *knftables.Transaction { return n.in.NewTransaction() }

func (n nodeNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.do(func() error { return n.in.Run(ctx, tx) })
}

func (n nodeNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.do(func() error { return n.in.Check(ctx, tx) })
}

func (n nodeNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.do(func() error { out, err = n.in.ListAll(ctx); return err })
	return out, err
}

func (n nodeNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = n.do(func() error { out, err = n.in.List(ctx, objectType); return err })
	return out, err
}

func (n nodeNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.do(func() error { out, err = n.in.ListRules(ctx, chain); return err })
	return out, err
}

func (n nodeNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = n.do(func() error { out, err = n.in.ListElements(ctx, objectType, name); return err })
	return out, err
}

func (n nodeNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.do(func() error { out, err = n.in.ListCounters(ctx); return err })
	return out, err
}
