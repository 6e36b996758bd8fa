#!/usr/bin/env bash
# Installs the Debian packages kpr's build and tests need, when missing:
# clang and libbpf-dev for `make generate`, bpftool for the BTF test,
# iproute2 for the test namespaces, iptables and nftables for kube-proxy.
# Runs apt only if something is absent.
set -euo pipefail

need=()
command -v clang >/dev/null || need+=(clang llvm)
[[ -f /usr/include/bpf/bpf_helpers.h ]] || need+=(libbpf-dev)
command -v bpftool >/dev/null || need+=(bpftool)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
command -v flock >/dev/null || need+=(util-linux)
# Upstream kube-proxy, the benchmark's peer, programs these inside its netns.
command -v iptables-restore >/dev/null || need+=(iptables)
command -v nft >/dev/null || need+=(nftables)
command -v conntrack >/dev/null || need+=(conntrack)
# make test-kernels boots Debian's kernels in qemu, with busybox as the
# VMs' shell and tools.
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
# A static one: the initramfs has no libc (ldd fails on static binaries).
{ [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1; } || need+=(busybox-static)
[[ -d /usr/include/$("$(dirname "$0")/multiarch.sh")/asm || -d /usr/include/asm ]] || need+=(linux-libc-dev)

if [[ ${#need[@]} -eq 0 ]]; then
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "hack/deps.sh: missing packages ${need[*]}; install them as root (apt-get install ${need[*]})" >&2
	exit 1
fi
echo "hack/deps.sh: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
