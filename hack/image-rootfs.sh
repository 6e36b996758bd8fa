#!/usr/bin/env bash
# Builds the runtime file tree of kpr's image from Debian packages, for
# `make image` (hack/image), where no base image can be pulled:
#   hack/image-rootfs.sh DIR
# fills DIR (which must not exist) with the packages below and every package
# they depend on, as apt resolves them, extracted, without docs or man pages
# (hack/debroot.sh, which hack/cluster-images.sh uses too).
#
# The packages, and why the image carries them:
#   iptables, ipset, conntrack  the iptables fallback mode (iptables-nft and
#                               iptables-legacy; kpr picks the node's one)
#                               and its conntrack cleanup
#   nftables                    the nftables mode, and kpr cleanup --kube-proxy
#                               of kube-proxy's nftables tables
#   dash, mount, util-linux     /bin/sh, mount and mountpoint, for the
#                               DaemonSet's init container that mounts bpffs
#   coreutils                   sleep, for the cleanup DaemonSet's wait and
#                               its idle container
#   bpftool                     for operators: bpftool map dump of kpr's
#                               pinned maps from kubectl exec, as the README
#                               shows
# The debian:trixie-slim runtime stage of the Dockerfile carries the same.
#
# The .debs are cached in ${KPR_IMAGE_CACHE:-~/.cache/kpr/image}/<suite>/debs
# and downloaded again only when the package list changes or
# KPR_IMAGE_REFRESH=1 (for security updates). apt runs with a private
# configuration (hack/apt.sh). KPR_IMAGE_SUITE picks the Debian suite
# (default trixie, Debian 13).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"

packages=(iptables ipset conntrack nftables dash mount util-linux coreutils bpftool)

if [[ $# -ne 1 ]]; then
	echo "usage: hack/image-rootfs.sh DIR" >&2
	exit 2
fi
out=$1

debroot kpr "$out" "${packages[@]}"

# dpkg's maintainer scripts never ran, so do what they would have: the
# alternatives the iptables package registers, pointing at iptables-nft as
# Debian's default does.
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -sfn "${t/tables/tables-nft}" "$out/usr/sbin/$t"
done
