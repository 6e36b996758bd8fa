#!/usr/bin/env bash
# Builds the runtime file tree of kpr's image from Debian packages, for
# `make image` (hack/image), where no base image can be pulled:
#   hack/image-rootfs.sh DIR
# fills DIR (which must not exist) with the packages below and every package
# they depend on, as apt resolves them, extracted, without docs or man pages.
#
# The packages, and why the image carries them:
#   iptables, ipset, conntrack  the iptables fallback mode (iptables-nft and
#                               iptables-legacy; kpr picks the node's one)
#                               and its conntrack cleanup
#   dash, mount, util-linux     /bin/sh, mount and mountpoint, for the
#                               DaemonSet's init container that mounts bpffs
# The debian:trixie-slim runtime stage of the Dockerfile carries the same.
#
# The .debs are cached in ${KPR_IMAGE_CACHE:-~/.cache/kpr/image}/<suite>/debs
# and downloaded again only when the package list changes or
# KPR_IMAGE_REFRESH=1 (for security updates). apt runs with a private
# configuration (hack/apt.sh). KPR_IMAGE_SUITE picks the Debian suite
# (default trixie, Debian 13).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

packages=(iptables ipset conntrack nftables dash mount util-linux)
suite=${KPR_IMAGE_SUITE:-trixie}
cache=${KPR_IMAGE_CACHE:-$HOME/.cache/kpr/image}/$suite

if [[ $# -ne 1 ]]; then
	echo "usage: hack/image-rootfs.sh DIR" >&2
	exit 2
fi
out=$1
if [[ -e $out ]]; then
	echo "hack/image-rootfs.sh: $out exists; remove it first" >&2
	exit 1
fi

apt_private "$cache" "$suite"
debs=$cache/debs
if [[ ${KPR_IMAGE_REFRESH:-} == 1 || $(cat "$debs/packages.want" 2>/dev/null) != "${packages[*]}" ]]; then
	apt_private_update "hack/image-rootfs.sh: $suite"
	rm -f "$debs"/*.deb "$debs/packages.want"
	echo "hack/image-rootfs.sh: $suite: downloading ${packages[*]} and their dependencies" >&2
	# install --download-only resolves the dependency closure the way an
	# install would (alternatives, virtual packages), against the empty
	# status file: every package the closure needs is fetched.
	apt-get "${apt_opts[@]}" -o "Dir::Cache::archives=$debs" -qq -y --no-install-recommends \
		install --download-only "${packages[@]}" >&2
	echo "${packages[*]}" >"$debs/packages.want"
fi

mkdir -p "$out"
n=0
for deb in "$debs"/*.deb; do
	dpkg-deb -x "$deb" "$out"
	n=$((n + 1))
done
if [[ $n -eq 0 ]]; then
	echo "hack/image-rootfs.sh: no packages in $debs" >&2
	exit 1
fi

# dpkg's maintainer scripts never ran, so do what they would have: the
# merged-/usr links (the ELF interpreter is /lib64/ld-linux-x86-64.so.2),
# and the alternatives the iptables package registers, pointing at
# iptables-nft as Debian's default does.
for d in bin sbin lib lib64; do
	if [[ -d $out/usr/$d && ! -e $out/$d ]]; then
		ln -s "usr/$d" "$out/$d"
	fi
done
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -sfn "${t/tables/tables-nft}" "$out/usr/sbin/$t"
done
mkdir -p "$out/tmp" "$out/run" "$out/var" "$out/proc" "$out/sys" "$out/dev" "$out/usr/local/bin"
chmod 1777 "$out/tmp"
# xtables takes its lock in /run (the DaemonSet mounts the host's there).
ln -sfn ../run "$out/var/run"
# What nothing in the image reads.
rm -rf "$out"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh} "$out"/etc/{cron.*,logrotate.d}
echo "hack/image-rootfs.sh: $n packages from $suite in $out" >&2
