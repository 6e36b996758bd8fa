#!/usr/bin/env bash
# Fetches Debian's packaged kernels for the kernel matrix (tests/kernels) and
# caches each under ${KPR_KERNEL_CACHE:-~/.cache/kpr/kernels}/<release>/
# (<suite> is a symlink to it):
#   vmlinuz, version (the uname -r), modules/<name>.ko (only the modules the
#   VM tests load and their dependencies, decompressed) and modules.load
#   (their names in load order).
# Usage: hack/kernels.sh SUITE...   (bullseye, bookworm, trixie)
# Prints the cache directory of each suite, one a line.
#
# apt runs with a private configuration (its own sources list, state and
# cache under the kernel cache), so the system's apt setup is never touched
# and suites the system does not carry (bullseye, trixie) resolve too.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

cache=${KPR_KERNEL_CACHE:-$HOME/.cache/kpr/kernels}
arch=$(dpkg --print-architecture)

# The modules tests/kernels/init loads, by name, with their dependencies.
# Missing ones (built in) are fine.
# bridge joins the test pods' veths; crc32c_generic is libcrc32c's soft
# dependency (nf_conntrack needs it, and modinfo's softdep is not followed).
# The rest serve the iptables backend's tests: iptables-legacy (ip_tables,
# iptable_*), iptables-nft (nf_tables, nft_compat, nft_chain_nat), the
# matches and targets kpr's rules use, and conntrack over netlink. The IPVS
# backend's tests need ip_vs with its schedulers, dummy, the ipset types
# it keeps and xt_set. br_netfilter passes bridged traffic through
# netfilter, as kubeadm requires of a node: without it the reply of a pod
# to another pod on the bridge skips the de-NAT of the IPVS connection
# (tests/e2e's IPVS mode, pod clients of a ClusterIP). The nft_* beyond
# those serve the nftables mode (tests/e2e's move between it and the IPVS
# mode): the expressions its ruleset uses that are modules of their own.
# virtio_net, overlay and qemu_fw_cfg serve the real cluster's node VMs
# (tests/realcluster): their NIC, containerd's snapshotter, and the node's
# configuration, which the host passes in through fw_cfg; and xt_multiport
# their portmap CNI plugin's hostPort rules.
modules=(virtio_net overlay qemu_fw_cfg crc32c_generic veth bridge br_netfilter dummy nf_conntrack sch_ingress cls_bpf ip_vs ip_vs_rr
	nf_nat nfnetlink nf_conntrack_netlink nf_tables nft_compat nft_chain_nat nft_counter
	nft_ct nft_nat nft_masq nft_numgen nft_fib nft_fib_inet nft_fib_ipv4 nft_fib_ipv6
	nft_reject nft_reject_inet nft_reject_ipv4 nft_reject_ipv6
	ip_tables ip6_tables iptable_nat ip6table_nat iptable_filter ip6table_filter
	xt_comment xt_conntrack xt_tcpudp xt_mark xt_addrtype xt_statistic xt_recent xt_MASQUERADE xt_nat xt_multiport
	ipt_REJECT ip6t_REJECT
	ip_vs_wrr ip_vs_sh ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet xt_set)

fetch() {
	local suite=$1 dir=$cache/$1
	if [[ -f $dir/vmlinuz && $(cat "$dir/modules.want" 2>/dev/null) == "${modules[*]}" ]]; then
		echo "$dir"
		return
	fi
	local apt=$cache/.apt/$suite apt_opts
	apt_private "$apt" "$suite"
	local opts=("${apt_opts[@]}")
	# The .deb stays in the cache: a changed module list re-extracts it
	# without downloading again.
	local pkg deb
	deb=$(find "$apt/debs" -name 'linux-image-*.deb' | head -1)
	if [[ -z $deb ]]; then
		apt_private_update "hack/kernels.sh: $suite"
		# linux-image-amd64 is the metapackage; its dependency is the real image.
		pkg=$(apt-cache "${opts[@]}" depends "linux-image-$arch" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
		if [[ -z $pkg ]]; then
			echo "hack/kernels.sh: $suite: no linux-image package behind linux-image-$arch in ${KPR_DEBIAN_MIRROR:-deb.debian.org}" >&2
			exit 1
		fi
		echo "hack/kernels.sh: $suite: downloading $pkg" >&2
		(cd "$apt/debs" && apt-get "${opts[@]}" -qq download "$pkg" >&2)
		deb=$(find "$apt/debs" -name 'linux-image-*.deb' | head -1)
	fi
	pkg=$(basename "$deb")
	local tmp
	tmp=$(mktemp -d "$cache/.extract-$suite.XXXXXX")
	trap 'rm -rf "$tmp"' RETURN
	dpkg-deb -x "$deb" "$tmp"
	# The modules live in lib/modules (bullseye, bookworm) or, after the
	# /usr merge, usr/lib/modules (trixie).
	local moddir="" d
	for d in "$tmp"/lib/modules/* "$tmp"/usr/lib/modules/*; do
		[[ -d $d/kernel ]] && moddir=$d && break
	done
	if [[ -z $moddir ]]; then
		echo "hack/kernels.sh: $suite: no lib/modules/<version>/kernel in $pkg" >&2
		exit 1
	fi
	local kver
	kver=$(basename "$moddir")
	local staged=$tmp/out
	mkdir -p "$staged"
	cp "$tmp/boot/vmlinuz-$kver" "$staged/vmlinuz"
	echo "$kver" >"$staged/version"
	# Debian's packages ship no modules.dep (depmod builds it at install
	# time, and kmod may be absent here), so each module's dependencies
	# come from its own .modinfo "depends=" field. The modules are
	# decompressed here (6.12 ships .ko.xz) so the init needs no xz, and
	# listed in load order, dependencies first, in modules.load.
	declare -A path=() seen=()
	local f n order=()
	while IFS= read -r f; do
		n=$(basename "$f"); n=${n%%.ko*}; n=${n//-/_}
		path[$n]=$f
	done < <(find "$moddir/kernel" -name '*.ko*')
	mkdir -p "$staged/modules"
	visit() {
		local n=$1 f out dep
		[[ -n ${seen[$n]:-} ]] && return
		seen[$n]=1
		f=${path[$n]:-}
		if [[ -z $f ]]; then
			echo "hack/kernels.sh: $suite: module $n not in the package (built in?)" >&2
			return
		fi
		out=$staged/modules/$n.ko
		case $f in
		*.ko.xz) xz -dc "$f" >"$out" ;;
		*.ko.zst) zstd -qdc "$f" >"$out" ;;
		*.ko.gz) gzip -dc "$f" >"$out" ;;
		*) cp "$f" "$out" ;;
		esac
		for dep in $(tr '\0' '\n' <"$out" | sed -n 's/^depends=//p' | tr ',' ' '); do
			visit "${dep//-/_}"
		done
		order+=("$n")
	}
	for m in "${modules[@]}"; do
		visit "$m"
	done
	printf '%s\n' "${order[@]}" >"$staged/modules.load"
	echo "${modules[*]}" >"$staged/modules.want"
	# Cached by kernel release; the suite name points at the one it ships.
	rm -rf "${cache:?}/$kver"
	mv "$staged" "$cache/$kver"
	rm -rf "$dir"
	ln -sfn "$kver" "$dir"
	echo "hack/kernels.sh: $suite: cached $kver in $dir" >&2
	echo "$dir"
}

if [[ $# -eq 0 ]]; then
	echo "usage: hack/kernels.sh SUITE... (bullseye bookworm trixie)" >&2
	exit 2
fi
mkdir -p "$cache"
for s in "$@"; do
	fetch "$s"
done
