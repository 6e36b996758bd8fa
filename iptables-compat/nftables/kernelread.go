package nftables

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// kernelReader reads what knftables reads through nft, or cannot read at
// all, straight from the kernel over netlink. The drift check needs it at
// scale: nft prints a whole table to answer any question about it, and
// the kernel restarts a table-wide rule dump from the first rule on every
// receive, so both grow with the square of the table.
type kernelReader interface {
	// generation is the ruleset's generation: the kernel adds one for
	// every transaction committed in the network namespace, whoever
	// commits it.
	generation() (uint32, error)
	// ruleCounts is how many rules each of chains holds in kpr's table;
	// a chain the table does not hold counts 0.
	ruleCounts(chains []string) (map[string]int, error)
	// tableObjects is how many objects kpr's table holds: the kernel
	// counts its chains, its named sets and maps, and any stateful
	// object or flowtable, as one each. ok is false where
	// the table does not exist.
	tableObjects() (n uint32, ok bool, err error)
}

func nftMessage(msg int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg)
}

// nfgenmsg is the header every nftables message starts with.
func nfgenmsg(family uint8) []byte { return []byte{family, unix.NFNETLINK_V0, 0, 0} }

func dialNFTables() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("open a netfilter netlink socket: %w", err)
	}
	return c, nil
}

// netlinkReader is the kernelReader of the calling thread's network
// namespace.
type netlinkReader struct{}

func (netlinkReader) generation() (uint32, error) {
	c, err := dialNFTables()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: nftMessage(unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   nfgenmsg(unix.AF_UNSPEC),
	})
	if err != nil {
		return 0, fmt.Errorf("read the nftables ruleset generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("decode the nftables ruleset generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, fmt.Errorf("read the nftables ruleset generation: the kernel's answer has no NFTA_GEN_ID")
}

func (netlinkReader) tableObjects() (uint32, bool, error) {
	c, err := dialNFTables()
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_TABLE_NAME, TableName)
	attrs, err := ae.Encode()
	if err != nil {
		return 0, false, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: nftMessage(unix.NFT_MSG_GETTABLE), Flags: netlink.Request},
		Data:   append(nfgenmsg(unix.NFPROTO_INET), attrs...),
	})
	if isNotFound(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the nftables table %s %s: %w", Family, TableName, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, false, fmt.Errorf("decode the nftables table %s %s: %w", Family, TableName, err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_TABLE_USE {
				return ad.Uint32(), true, nil
			}
		}
	}
	return 0, false, fmt.Errorf("read the nftables table %s %s: the kernel's answer has no NFTA_TABLE_USE", Family, TableName)
}

// ruleCounts dumps the rules of one chain at a time: the kernel finds a
// named chain by its hash, where a table-wide dump would restart from
// the table's first rule on every receive.
func (netlinkReader) ruleCounts(chains []string) (map[string]int, error) {
	c, err := dialNFTables()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	out := make(map[string]int, len(chains))
	for _, chain := range chains {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		ae.String(unix.NFTA_RULE_TABLE, TableName)
		ae.String(unix.NFTA_RULE_CHAIN, chain)
		attrs, err := ae.Encode()
		if err != nil {
			return nil, err
		}
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: nftMessage(unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
			Data:   append(nfgenmsg(unix.NFPROTO_INET), attrs...),
		})
		if err != nil {
			return nil, fmt.Errorf("dump the rules of nftables chain %s %s %s: %w", Family, TableName, chain, err)
		}
		n := 0
		for _, m := range msgs {
			if m.Header.Type == nftMessage(unix.NFT_MSG_NEWRULE) {
				n++
			}
		}
		out[chain] = n
	}
	return out, nil
}
