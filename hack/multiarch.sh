#!/usr/bin/env bash
# Prints the Debian multiarch tuple of this build host (x86_64-linux-gnu,
# aarch64-linux-gnu, ...): the directory under /usr/include that holds the
# kernel's asm/ headers. clang -target bpf does not search it by itself, and
# the BPF programs include linux/bpf.h, which needs asm/types.h.
set -euo pipefail
if command -v gcc >/dev/null && arch=$(gcc -print-multiarch 2>/dev/null) && [[ -n $arch ]]; then
	echo "$arch"
elif command -v dpkg-architecture >/dev/null; then
	dpkg-architecture -qDEB_HOST_MULTIARCH
else
	echo "$(uname -m)-linux-gnu"
fi
