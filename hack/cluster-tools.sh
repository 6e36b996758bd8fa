#!/usr/bin/env bash
# Builds the binaries a real Kubernetes test cluster needs (the node
# components, the container runtime, CNI plugins, CoreDNS, the pause
# program, kubectl and e2e.test) into a cache directory outside the repo
# and prints that directory on stdout (progress goes to stderr). Everything
# comes from pinned Go modules (tests/tools, tests/clustertools/*) and
# Debian's gcc; docs/cluster-tools.md says what each binary is for.
#
# The directory defaults to ~/.cache/kpr/cluster-tools/<kubernetes version>
# so every checkout and every CI run on the same machine shares one build;
# set KPR_CLUSTER_TOOLS_DIR to put it elsewhere. Binaries are built in
# groups, one per module; a group is rebuilt only when one of its binaries
# is missing or its inputs (the module's files and this script, recorded in
# a stamp file per group) changed. A flock keeps two concurrent callers from
# building over each other.
set -euo pipefail

# KUBE_VERSION must equal tests/tools' k8s.io/kubernetes version (and
# hack/tools.sh's); tests/clustertools checks it.
KUBE_VERSION=v1.37.2

# BINARIES: what the cache holds, one line each: the binary's path in the
# cache, the folder (from the repository's root) of the Go module that pins
# it, and the Go package it is built from (for pause, its C source). The
# binaries of one folder are built together. tests/clustertools checks that
# each package is a tool of its module at a released version.
BINARIES=(
	"kubelet                  tests/tools                    k8s.io/kubernetes/cmd/kubelet"
	"kube-controller-manager  tests/tools                    k8s.io/kubernetes/cmd/kube-controller-manager"
	"kube-scheduler           tests/tools                    k8s.io/kubernetes/cmd/kube-scheduler"
	"kubectl                  tests/tools                    k8s.io/kubernetes/cmd/kubectl"
	"kubeadm                  tests/tools                    k8s.io/kubernetes/cmd/kubeadm"
	"agnhost                  tests/tools                    k8s.io/kubernetes/test/images/agnhost"
	"e2e.test                 tests/tools                    k8s.io/kubernetes/test/e2e"
	"ginkgo                   tests/tools                    github.com/onsi/ginkgo/v2/ginkgo"
	"containerd               tests/clustertools/containerd  github.com/containerd/containerd/v2/cmd/containerd"
	"containerd-shim-runc-v2  tests/clustertools/containerd  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	"ctr                      tests/clustertools/containerd  github.com/containerd/containerd/v2/cmd/ctr"
	"runc                     tests/clustertools/runc        github.com/opencontainers/runc"
	"cni/bridge               tests/clustertools/cni         github.com/containernetworking/plugins/plugins/main/bridge"
	"cni/host-local           tests/clustertools/cni         github.com/containernetworking/plugins/plugins/ipam/host-local"
	"cni/loopback             tests/clustertools/cni         github.com/containernetworking/plugins/plugins/main/loopback"
	"cni/portmap              tests/clustertools/cni         github.com/containernetworking/plugins/plugins/meta/portmap"
	"coredns                  tests/clustertools/coredns     github.com/coredns/coredns"
	"pause                    tests/clustertools/pause       pause.c"
	"helm                     tests/clustertools/helm        helm.sh/helm/v3/cmd/helm"
)

usage() {
	cat >&2 <<EOF
usage: hack/cluster-tools.sh
Builds kubelet, kube-controller-manager, kube-scheduler, kubectl, kubeadm,
agnhost and e2e.test ($KUBE_VERSION), ginkgo (which runs e2e.test's specs in parallel), containerd, runc, the CNI plugins bridge,
host-local, loopback and portmap, CoreDNS, Helm and pause into \$KPR_CLUSTER_TOOLS_DIR
(default ~/.cache/kpr/cluster-tools/$KUBE_VERSION), unless already built from
the current inputs, and prints that directory.
EOF
}
if [[ $# -gt 0 ]]; then
	usage
	[[ $1 == -h || $1 == --help ]] && exit 0
	exit 2
fi

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_dir=${KPR_CLUSTER_TOOLS_DIR:-${HOME:-/root}/.cache/kpr/cluster-tools/$KUBE_VERSION}

log() { echo "hack/cluster-tools.sh: $*" >&2; }

# The groups (module folders) in the order of BINARIES.
groups=()
for line in "${BINARIES[@]}"; do
	read -r _ dir _ <<<"$line"
	[[ " ${groups[*]} " == *" $dir "* ]] || groups+=("$dir")
done

# The lines of BINARIES of group $1, as "binary package" pairs.
members() {
	local line bin dir pkg
	for line in "${BINARIES[@]}"; do
		read -r bin dir pkg <<<"$line"
		[[ $dir == "$1" ]] && echo "$bin $pkg"
	done
	return 0
}

# Everything group $1's binaries are built from: its module's go.mod,
# go.sum and sources (for tests/tools that includes e2eimports, which
# decides go.sum), this script, with its flags, and the Go release. A
# change to any of them (a version bump, a new ldflag, a new Go) makes that
# group's cached build stale.
stamp_of() {
	(
		cd "$repo_root"
		go env GOVERSION
		find "$1" -maxdepth 2 -type f \( -name go.mod -o -name go.sum -o -name '*.go' -o -name '*.c' \) | LC_ALL=C sort |
			while read -r f; do
				echo "== $f"
				cat "$f"
			done
		cat hack/cluster-tools.sh
	) | sha256sum | cut -d' ' -f1
}

stamp_file() { echo "$tools_dir/.stamp.${1//\//_}"; }

group_built() {
	local bin _pkg
	while read -r bin _pkg; do
		[[ -x "$tools_dir/$bin" ]] || return 1
	done < <(members "$1")
	[[ "$(cat "$(stamp_file "$1")" 2>/dev/null)" == "$(stamp_of "$1")" ]]
}

stale_groups() {
	local g
	stale=()
	for g in "${groups[@]}"; do
		group_built "$g" || stale+=("$g")
	done
}

stale_groups
if [[ ${#stale[@]} -eq 0 ]]; then
	echo "$tools_dir"
	exit 0
fi

mkdir -p "$tools_dir"
exec 9>"$tools_dir/.build.lock"
if ! flock -n 9; then
	log "another build of $tools_dir is running; waiting for it"
	flock 9
fi

# The build we waited for may have produced everything already.
stale_groups
if [[ ${#stale[@]} -eq 0 ]]; then
	echo "$tools_dir"
	exit 0
fi

"$repo_root/hack/cluster-tools-deps.sh" >&2

# The version of module $2 that the module in folder $1 requires.
module_version() {
	(cd "$repo_root/$1" && go list -m -f '{{.Version}}' "$2")
}

# The Go packages of group $1, one per line.
packages() {
	local _bin pkg
	while read -r _bin pkg; do
		echo "$pkg"
	done < <(members "$1")
}

# build_group DIR SCRATCH: builds group DIR's binaries into SCRATCH, under
# the names BINARIES gives them. Every Go build is -trimpath, so the
# binaries do not depend on where the repo lives, and stripped (-s -w): no
# debug info is needed for tools we only run.
build_group() {
	local dir=$1 scratch=$2
	local -a pkgs
	mapfile -t pkgs < <(packages "$dir")
	cd "$repo_root/$dir"
	export GOWORK=off
	case $dir in
	tests/tools)
		# Static, with the -X flags of hack/tools.sh, which stamp the
		# release the way Kubernetes' own build does, so --version and the
		# kubelet's reported version say v1.37.2 rather than
		# v0.0.0-master. e2e.test is the test binary of package
		# test/e2e (go test -c), not a command.
		local minor=${KUBE_VERSION#v1.} version_flags="" pkg
		minor=${minor%%.*}
		for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			version_flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
		done
		local -a cmds=()
		for pkg in "${pkgs[@]}"; do
			case $pkg in
			k8s.io/kubernetes/test/e2e | k8s.io/kubernetes/test/images/agnhost) ;;
			*) cmds+=("$pkg") ;;
			esac
		done
		CGO_ENABLED=0 go build -trimpath -ldflags="-s -w$version_flags" -o "$scratch/" "${cmds[@]}"
		# agnhost carries its own version, the one e2e.test asks for
		# (registry.k8s.io/e2e-test-images/agnhost:<it>), in a VERSION
		# file that its image build stamps in.
		local agnhost=k8s.io/kubernetes/test/images/agnhost agnhost_version
		agnhost_version=$(cat "$(go list -f '{{.Dir}}' "$agnhost")/VERSION")
		CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.Version=$agnhost_version" -o "$scratch/" "$agnhost"
		# -vet=off: go test runs vet on the package it builds, and this
		# is Kubernetes' code, not ours to check.
		CGO_ENABLED=0 go test -c -vet=off -trimpath -ldflags="-s -w$version_flags" -o "$scratch/e2e.test" k8s.io/kubernetes/test/e2e
		;;
	tests/clustertools/containerd)
		# The tags and flags of containerd's `make STATIC=1`: static,
		# no cgo, no man-page generator. No btrfs (needs cgo), devmapper
		# or zfs snapshotters: the nodes use overlayfs. The shim leaves
		# out gRPC, as upstream's shim build does.
		local mod=github.com/containerd/containerd/v2 v tags
		v=$(module_version "$dir" "$mod")
		tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
		local ldflags="-s -w -X $mod/version.Version=$v -X $mod/version.Package=$mod"
		CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$scratch/" "$mod/cmd/containerd" "$mod/cmd/ctr"
		CGO_ENABLED=0 go build -trimpath -tags "$tags no_grpc" -ldflags "$ldflags" -o "$scratch/" "$mod/cmd/containerd-shim-runc-v2"
		;;
	tests/clustertools/runc)
		# runc needs cgo (its nsenter runs C before the Go runtime starts)
		# and libseccomp for seccomp profiles; it is linked statically,
		# against Debian's libseccomp.a and glibc's libc.a, as runc's
		# `make static` does (netgo and osusergo keep glibc's NSS out).
		# No libpathrs tag: that Rust library is not in Debian.
		CGO_ENABLED=1 go build -trimpath -tags "seccomp urfave_cli_no_docs netgo osusergo" \
			-ldflags "-s -w -extldflags -static" -o "$scratch/" "${pkgs[@]}"
		if ldd "$scratch/runc" >/dev/null 2>&1; then
			log "runc is not static:"
			ldd "$scratch/runc" >&2
			return 1
		fi
		;;
	tests/clustertools/cni)
		# As the plugins' release build: no cgo, the version stamped in.
		local mod=github.com/containernetworking/plugins v
		v=$(module_version "$dir" "$mod")
		mkdir -p "$scratch/cni"
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X $mod/pkg/utils/buildversion.BuildVersion=$v" \
			-o "$scratch/cni/" "${pkgs[@]}"
		;;
	tests/clustertools/coredns)
		# As CoreDNS' Makefile: no cgo; its version is a constant in
		# the source.
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$scratch/" "${pkgs[@]}"
		;;
	tests/clustertools/helm)
		# As Helm's Makefile: no cgo, its version stamped in.
		local mod=helm.sh/helm/v3 v
		v=$(module_version "$dir" "$mod")
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X $mod/internal/version.version=$v" -o "$scratch/" "${pkgs[@]}"
		;;
	tests/clustertools/pause)
		gcc -Os -static -s -Wall -Wextra -Werror -o "$scratch/pause" "${pkgs[@]}"
		;;
	*)
		log "no build for $dir"
		return 1
		;;
	esac
}

log "building ${stale[*]} into $tools_dir (all of them from scratch: about 10 minutes on 2 CPUs, docs/cluster-tools.md)"
start=$SECONDS
# Build each group into a scratch directory and move its binaries in only
# when all of them built, so an interrupted build never leaves a half set
# that group_built would take as complete.
scratch=$(mktemp -d "$tools_dir/.build.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for g in "${stale[@]}"; do
	group_start=$SECONDS
	log "building $g"
	rm -rf "${scratch:?}"/*
	(build_group "$g" "$scratch")
	while read -r bin _pkg; do
		mkdir -p "$(dirname "$tools_dir/$bin")"
		mv -f "$scratch/$bin" "$tools_dir/$bin"
	done < <(members "$g")
	stamp_of "$g" >"$(stamp_file "$g")"
	log "built $g in $((SECONDS - group_start))s"
done
log "built in $((SECONDS - start))s"
echo "$tools_dir"
