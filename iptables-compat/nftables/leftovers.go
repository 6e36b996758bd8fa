package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane/leftovers"
)

// recordMode names the nftables mode's record of the network namespaces
// it writes (package leftovers).
const recordMode = "nftables"

// Record records, beside bpfRoot, that the nftables mode writes kpr's
// table in the network namespace at netnsPath (kpr's own if empty). It is
// called before the first write, so that a kpr in another mode or `kpr
// cleanup` later removes the table even if this one crashes.
func Record(bpfRoot, netnsPath string) error { return leftovers.Write(bpfRoot, netnsPath, recordMode) }

// RemoveLeftovers deletes kpr's table from the network namespace at
// netnsPath if the nftables mode recorded writing it, and then the
// record. Count is the chains the table held.
func RemoveLeftovers(bpfRoot, netnsPath string) (leftovers.Removed, error) {
	return leftovers.Remove(bpfRoot, netnsPath, recordMode, "the nftables table kpr's nftables mode wrote", func() (int, error) {
		nft, err := Open(netnsPath)
		if err != nil {
			return 0, err
		}
		return Cleanup(nft)
	})
}

// Cleanup deletes kpr's table, which only kpr writes, and with it every
// chain, set and map; it returns how many chains went, 0 when there was
// no table.
func Cleanup(nft knftables.Interface) (int, error) {
	ctx := context.Background()
	chains, err := nft.List(ctx, "chain")
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list the chains of the nftables table %s %s: %w", Family, TableName, err)
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); isNotFound(err) {
		// The chains were listed over netlink, which lists none, and no
		// error, for a table that does not exist.
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("delete the nftables table %s %s: %w", Family, TableName, err)
	}
	return len(chains), nil
}
