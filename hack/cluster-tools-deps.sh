#!/usr/bin/env bash
# Installs the Debian packages hack/cluster-tools.sh needs, when missing:
# gcc and glibc's static libraries (libc6-dev) for the static pause and
# runc, libseccomp-dev for runc's seccomp support (its libseccomp.a is what
# the static runc links), pkg-config, through which runc's seccomp binding
# finds libseccomp, and flock (util-linux). Runs apt only if something is
# absent, like hack/deps.sh.
set -euo pipefail

multiarch=$("$(dirname "$0")/multiarch.sh")
need=()
command -v gcc >/dev/null || need+=(gcc)
[[ -f /usr/lib/$multiarch/libc.a ]] || need+=(libc6-dev)
[[ -f /usr/lib/$multiarch/libseccomp.a ]] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v flock >/dev/null || need+=(util-linux)

if [[ ${#need[@]} -eq 0 ]]; then
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "hack/cluster-tools-deps.sh: missing packages ${need[*]}; install them as root (apt-get install ${need[*]})" >&2
	exit 1
fi
echo "hack/cluster-tools-deps.sh: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
