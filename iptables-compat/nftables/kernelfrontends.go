package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// udpFrontendsInTable returns the UDP frontends kpr's table dispatches
// (service-ips) or rejects (no-endpoint-services), read from the maps
// present lists: after a restart, those of Services deleted meanwhile
// still have conntrack entries that only this reading can name.
func udpFrontendsInTable(ctx context.Context, nft knftables.Interface, present tableObjects) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, fam := range netfilter.Families {
		for _, base := range []string{mapServiceIPs, mapNoEndpoints} {
			m := mapOf(base, fam)
			if !slices.Contains(present.maps, m) {
				continue
			}
			els, err := nft.ListElements(ctx, "map", m)
			if err != nil {
				return out, fmt.Errorf("list the elements of map %s: %w", m, err)
			}
			for _, e := range els {
				// A frontend's key is "address . protocol . port".
				if len(e.Key) != 3 || e.Key[1] != "udp" {
					continue
				}
				addr, aErr := netip.ParseAddr(e.Key[0])
				port, pErr := strconv.ParseUint(e.Key[2], 10, 16)
				if aErr == nil && pErr == nil {
					out = append(out, netip.AddrPortFrom(addr.Unmap(), uint16(port)))
				}
			}
		}
	}
	return out, nil
}
