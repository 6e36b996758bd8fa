package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/netnsexec"
)

// Open returns the knftables.Interface to kpr's table in the network
// namespace at netnsPath, the calling one's if empty. It fails where nft
// cannot run or the kernel lacks nftables.
func Open(netnsPath string) (knftables.Interface, error) {
	if netnsPath == "" {
		return knftables.New(Family, TableName)
	}
	var nft knftables.Interface
	err := netnsexec.InPath(netnsPath, func() error {
		var err error
		nft, err = knftables.New(Family, TableName)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nftables in network namespace %s: %w", netnsPath, err)
	}
	return netnsNFT{in: nft, path: netnsPath}, nil
}

// netnsNFT runs every call of in inside the network namespace at path:
// nft, which each call executes, is started from a thread inside it.
type netnsNFT struct {
	in   knftables.Interface
	path string
}

func (n netnsNFT) do(fn func() error) error { return netnsexec.InPath(n.path, fn) }

func (n netnsNFT) NewTransaction() *knftables.Transaction { return n.in.NewTransaction() }

func (n netnsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.do(func() error { return n.in.Run(ctx, tx) })
}

func (n netnsNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.do(func() error { return n.in.Check(ctx, tx) })
}

func (n netnsNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.do(func() error { out, err = n.in.ListAll(ctx); return err })
	return out, err
}

func (n netnsNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = n.do(func() error { out, err = n.in.List(ctx, objectType); return err })
	return out, err
}

func (n netnsNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.do(func() error { out, err = n.in.ListRules(ctx, chain); return err })
	return out, err
}

func (n netnsNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = n.do(func() error { out, err = n.in.ListElements(ctx, objectType, name); return err })
	return out, err
}

func (n netnsNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.do(func() error { out, err = n.in.ListCounters(ctx); return err })
	return out, err
}
