package nftables

import (
	"strings"
	"syscall"

	"sigs.k8s.io/knftables"
)

// isNotFound tells whether err says that kpr's table, or an object in
// it, does not exist. knftables recognises nft's words for it; its
// netlink reads (google/nftables) format the kernel's ENOENT into the
// error's text, without wrapping it.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	return knftables.IsNotFound(err) || strings.Contains(err.Error(), syscall.ENOENT.Error())
}
