#!/usr/bin/env bash
# Builds the container images a real test cluster (kubelet v1.37.2,
# containerd 2.x) needs, where none can be pulled: one archive per image (an
# OCI image layout in a tar) that `ctr -n k8s.io images import ARCHIVE`
# loads, named with the references upstream uses, so that kubelet, kubeadm
# and the e2e tests find them (docs/cluster-images.md):
#   pause                registry.k8s.io/pause, the sandbox image
#   coredns              registry.k8s.io/coredns/coredns, kubeadm's DNS
#   agnhost              registry.k8s.io/e2e-test-images/agnhost
#   busybox, nginx       registry.k8s.io/e2e-test-images/{busybox,nginx}
#   glibc-dns-testing    registry.k8s.io/e2e-test-images/glibc-dns-testing
#   distroless-iptables  registry.k8s.io/build-image/distroless-iptables
#   regression-issue-74839  registry.k8s.io/e2e-test-images/regression-issue-74839
#   kube-proxy           registry.k8s.io/kube-proxy, kubeadm's kube-proxy add-on
#                        (distroless-iptables with kube-proxy on top)
# The references, run configurations and binaries of each image are in
# hack/image/clusterimages (images.go); the file trees from Debian packages
# (hack/debroot.sh) and what their Dockerfiles' RUN steps do are here.
#
# Inputs: the static binaries pause, coredns and agnhost in
# ${KPR_CLUSTER_TOOLS_DIR:-~/.cache/kpr/cluster-tools/v1.37.2}, and
# regression-issue-74839 and kube-log-runner there too or else built here
# from tests/tools' module (k8s.io/kubernetes and k8s.io/component-base of
# the same release); kube-proxy from hack/tools.sh (which builds it into
# ${KPR_TOOLS_DIR:-~/.cache/kpr/tools/v1.37.2} unless it is there and up to
# date, and prints that directory); Debian's packages (cached,
# hack/debroot.sh); k8s.io/kubernetes@v1.37.2 from the Go module cache
# (agnhost's porter certificate). The archives go to
# ${KPR_CLUSTER_IMAGES_DIR:-~/.cache/kpr/cluster-images/v1.37.2}, with
# IMAGES (each archive and the references it carries) and a stamp of the
# inputs: a second run with the same inputs does nothing but print the
# directory, on stdout (progress goes to stderr). KPR_IMAGE_REFRESH=1
# downloads the packages again and rebuilds.
set -euo pipefail

KUBE_VERSION=v1.37.2
BINARIES=(pause coredns agnhost)

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo_root/hack/debroot.sh"
tools_dir=${KPR_CLUSTER_TOOLS_DIR:-${HOME:-/root}/.cache/kpr/cluster-tools/$KUBE_VERSION}
out_dir=${KPR_CLUSTER_IMAGES_DIR:-${HOME:-/root}/.cache/kpr/cluster-images/$KUBE_VERSION}
GO=${GO:-go}

log() { echo "hack/cluster-images.sh: $*" >&2; }

# bin: the binaries the images take, as links to where they are.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for b in "${BINARIES[@]}"; do
	if [[ ! -f $tools_dir/$b || ! -x $tools_dir/$b ]]; then
		log "no executable $tools_dir/$b: the cluster tools build makes pause, coredns and agnhost there (or set KPR_CLUSTER_TOOLS_DIR)"
		exit 1
	fi
	ln -s "$tools_dir/$b" "$bin/$b"
done
# Small programs of the module the test tools are built from (hack/tools.sh,
# tests/tools), which build in a second: the conntrack test's boom-server
# (test/images/regression-issue-74839, std and k8s.io/utils), and
# kube-log-runner, the /go-runner of upstream's server images (std and
# k8s.io/apimachinery's resource).
small=(
	"regression-issue-74839  k8s.io/kubernetes/test/images/regression-issue-74839"
	"kube-log-runner         k8s.io/component-base/logs/kube-log-runner"
)
pkgs=()
for line in "${small[@]}"; do
	read -r b pkg <<<"$line"
	if [[ -x $tools_dir/$b ]]; then
		ln -s "$tools_dir/$b" "$bin/$b"
	else
		pkgs+=("$pkg")
	fi
	BINARIES+=("$b")
done
if [[ ${#pkgs[@]} -gt 0 ]]; then
	(cd "$repo_root/tests/tools" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$GO" build -trimpath -ldflags '-s -w' \
		-o "$bin/" "${pkgs[@]}")
fi
# kube-proxy: the test tools' (static, stamped v1.37.2 as upstream's
# release is), where hack/tools.sh builds it or finds it built.
kube_tools_dir=$("$repo_root/hack/tools.sh")
if [[ ! -f $kube_tools_dir/kube-proxy || ! -x $kube_tools_dir/kube-proxy ]]; then
	log "no executable $kube_tools_dir/kube-proxy, which hack/tools.sh builds"
	exit 1
fi
ln -s "$kube_tools_dir/kube-proxy" "$bin/kube-proxy"
BINARIES+=(kube-proxy)

# Everything the archives are made from but the .debs, which change only
# with the package lists (in this script) or KPR_IMAGE_REFRESH.
stamp=$(
	cd "$repo_root"
	{
		echo "suite $debroot_suite"
		cat hack/cluster-images.sh hack/debroot.sh hack/apt.sh hack/image/go.mod hack/image/go.sum
		ls hack/image/oci/*.go hack/image/clusterimages/*.go | grep -v _test.go | xargs cat
		for b in "${BINARIES[@]}"; do sha256sum <"$bin/$b"; done
	} | sha256sum | cut -d' ' -f1
)

up_to_date() {
	[[ ${KPR_IMAGE_REFRESH:-} != 1 && -f $out_dir/IMAGES && "$(cat "$out_dir/.stamp" 2>/dev/null)" == "$stamp" ]] || return 1
	local archive
	while read -r archive _; do
		[[ -f $out_dir/$archive ]] || return 1
	done <"$out_dir/IMAGES"
}

if up_to_date; then
	log "$out_dir is up to date"
	echo "$out_dir"
	exit 0
fi
mkdir -p "$out_dir"
exec 9>"$out_dir/.build.lock"
if ! flock -n 9; then
	log "another build of $out_dir is running; waiting for it"
	flock 9
fi
if up_to_date; then
	echo "$out_dir"
	exit 0
fi

start=$SECONDS
scratch=$(mktemp -d "$out_dir/.build.XXXXXX")
trap 'rm -rf "$scratch" "$bin"' EXIT
rootfs=$scratch/rootfs
mkdir -p "$rootfs"

# put FILE MODE: stdin into FILE (its directory made).
put() {
	mkdir -p "$(dirname "$1")"
	cat >"$1"
	chmod "$2" "$1"
}

# nsswitch DIR: glibc's /etc/nsswitch.conf, as libc-bin's postinst
# installs it. Without one glibc asks DNS for a host name before
# /etc/hosts, and not /etc/hosts at all when DNS answers that there is no
# such name: a pod's own name, which kubelet writes into /etc/hosts, would
# not resolve.
nsswitch() {
	put "$1/etc/nsswitch.conf" 644 <<-'EOF'
		passwd:         files
		group:          files
		shadow:         files
		gshadow:        files
		hosts:          files dns
		networks:       files
		protocols:      db files
		services:       db files
		ethers:         db files
		rpc:            db files
	EOF
}

kube_src=$(cd "$scratch" && GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [[ ! -f $kube_src/test/images/agnhost/Dockerfile ]]; then
	log "k8s.io/kubernetes@$KUBE_VERSION is not in the Go module cache ($kube_src)"
	exit 1
fi

# pause: FROM scratch, the binary only (images.go adds it).
mkdir -p "$rootfs/pause"

# coredns: FROM scratch with /tmp (for glog) and the binary; the CA
# certificates upstream copies in are for plugins that call out over TLS,
# which the cluster's Corefile uses none of.
mkdir -p "$rootfs/coredns/tmp"
chmod 1777 "$rootfs/coredns/tmp"

# agnhost (test/images/agnhost/Dockerfile): Alpine with bind-tools (dig,
# nslookup, host), curl, netcat-openbsd, iproute2 (ip, ss), iperf, bash,
# util-linux-misc (ipcs), socat, and busybox for sh and the rest (Debian's
# busybox, not busybox-static, whose sh would run its own nc and ip before
# those of netcat-openbsd and iproute2, hack/debroot.sh); CoreDNS
# at /coredns (the DNS tests run it), /uploads (netexec), porter's
# certificate, agnhost-2 and the user and group the SupplementalGroups tests
# look for. libc-bin is getent (musl-utils in Alpine), netbase
# /etc/services and /etc/protocols (alpine-baselayout's).
r=$rootfs/agnhost
debroot agnhost "$r" busybox bind9-dnsutils curl netcat-openbsd iproute2 iperf bash util-linux socat libc-bin netbase
debroot_alternative "$r" usr/bin/nc nc.openbsd
debroot_alternative "$r" usr/bin/netcat nc.openbsd
debroot_busybox "$r"
nsswitch "$r"
put "$r/etc/passwd" 644 <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/:/sbin/nologin
user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh
EOF
put "$r/etc/group" 644 <<'EOF'
root:x:0:root
nogroup:x:65534:
user-defined-in-image:x:1000:
group-defined-in-image:x:50000:user-defined-in-image
EOF
mkdir -p "$r/root" "$r/home/user-defined-in-image" "$r/uploads"
ln -s /usr/bin/iperf "$r/usr/local/bin/iperf"
ln -s agnhost "$r/agnhost-2"
install -m 644 "$kube_src/test/images/agnhost/porter/localhost.crt" "$kube_src/test/images/agnhost/porter/localhost.key" "$r/"

# busybox (busybox:1.37.0): busybox and its applets, root and nobody;
# busybox-static, the one binary the image needs.
r=$rootfs/busybox
debroot busybox "$r" busybox-static
debroot_busybox "$r"
nsswitch "$r"
put "$r/etc/passwd" 644 <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
put "$r/etc/group" 644 <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
mkdir -p "$r/root" "$r/home"

# nginx (nginx:1.27-alpine): nginx serving /usr/share/nginx/html on port 80
# (and [::]:80 where the pod has IPv6, as the image's entrypoint arranges),
# workers as user nginx, logs to the container's stdout and stderr, and
# busybox for sh.
r=$rootfs/nginx
debroot nginx "$r" nginx busybox
debroot_busybox "$r"
nsswitch "$r"
put "$r/etc/passwd" 644 <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/:/sbin/nologin
nginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin
EOF
put "$r/etc/group" 644 <<'EOF'
root:x:0:
nogroup:x:65534:
nginx:x:101:nginx
EOF
rm -rf "$r/etc/nginx/sites-available" "$r/etc/nginx/sites-enabled" "$r/etc/nginx/snippets" "$r/etc/init.d" "$r/etc/ufw"
put "$r/etc/nginx/nginx.conf" 644 <<'EOF'
user  nginx;
worker_processes  auto;

error_log  /var/log/nginx/error.log notice;
pid        /run/nginx.pid;

events {
    worker_connections  1024;
}

http {
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;
    access_log    /var/log/nginx/access.log;
    sendfile      on;
    keepalive_timeout  65;
    include /etc/nginx/conf.d/*.conf;
}
EOF
put "$r/etc/nginx/conf.d/default.conf" 644 <<'EOF'
server {
    listen       80;
    include      /etc/nginx/listen.d/*.conf;
    server_name  localhost;

    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }

    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
EOF
mkdir -p "$r/etc/nginx/listen.d" "$r/var/cache/nginx"
put "$r/docker-entrypoint.sh" 755 <<'EOF'
#!/bin/sh
# The nginx image's entrypoint, as far as a test cluster needs it: listen on
# [::]:80 as well where the pod has IPv6 (its
# 10-listen-on-ipv6-by-default.sh), then run the command.
set -e
if [ "$1" = nginx ] && [ -e /proc/net/if_inet6 ]; then
	echo 'listen [::]:80;' 2>/dev/null >/etc/nginx/listen.d/ipv6.conf || true
fi
exec "$@"
EOF
ln -sfn /dev/stdout "$r/var/log/nginx/access.log"
ln -sfn /dev/stderr "$r/var/log/nginx/error.log"

# regression-issue-74839: debian-base with the binary; the test runs the
# entrypoint only, so the tree is /tmp.
mkdir -p "$rootfs/regression-issue-74839/tmp"
chmod 1777 "$rootfs/regression-issue-74839/tmp"

# glibc-dns-testing (debian:bookworm-slim with dnsutils, CoreDNS at
# /coredns): the DNS tests' glibc querier runs dig, getent and sh there.
r=$rootfs/glibc-dns-testing
debroot glibc-dns-testing "$r" bind9-dnsutils base-files base-passwd bash dash coreutils debianutils \
	findutils grep sed mawk hostname libc-bin
debroot_alternative "$r" usr/bin/awk mawk
debroot_alternative "$r" usr/bin/which which.debianutils
cp "$r/usr/share/base-passwd/passwd.master" "$r/etc/passwd"
cp "$r/usr/share/base-passwd/group.master" "$r/etc/group"
nsswitch "$r"
mkdir -p "$r/root"

# distroless-iptables (kubernetes/release images/build/distroless-iptables,
# v0.9.x: Debian trixie's iptables, ipset, nft and kmod, dash, cat, grep,
# sleep and the like, upstream's iptables-wrapper, /go-runner), which is
# also the base of kube-proxy's image below. The KubeProxy CLOSE_WAIT test
# runs `sleep 600` in it and reads the node's conntrack table with sh, cat
# and grep, or with conntrack, which the image carries here (upstream's
# does not) so that the test runs where the kernel has no
# /proc/net/nf_conntrack. kube-proxy runs iptables, ip6tables, their -save
# and -restore (iptables and IPv6 modes, and the cleanup of their rules in
# nftables mode), nft (nftables mode), ipset and modprobe (IPVS mode).
r=$rootfs/distroless-iptables
debroot distroless-iptables "$r" iptables ipset nftables kmod conntrack dash coreutils grep debianutils
debroot_alternative "$r" usr/bin/which which.debianutils
# iptables-wrapper-installer.sh's work: the six commands run the wrapper,
# which points them at xtables-nft-multi or xtables-legacy-multi, as the
# node's rules are, the first time one runs.
put "$r/usr/sbin/iptables-wrapper" 755 <<'EOF'
#!/bin/sh
# iptables-wrapper, as upstream's distroless-iptables has it (the installer
# of kubernetes-sigs/iptables-wrappers): iptables, iptables-save,
# iptables-restore and their ip6tables twins are links to this script until
# the first of them runs. That one finds which iptables the node's rules are
# in, nft or legacy, points the six links at xtables-nft-multi or
# xtables-legacy-multi for every later command, and runs its command with
# it. kubelet's chains KUBE-IPTABLES-HINT and KUBE-KUBELET-CANARY, in the
# mangle table, name the node's iptables; where neither has them, the one
# with more rules wins, nft if that is neither.
set -e
cmd=${0##*/}
case $cmd in
iptables | iptables-save | iptables-restore | ip6tables | ip6tables-save | ip6tables-restore) ;;
*)
	echo "iptables-wrapper: runs as iptables, iptables-save, iptables-restore or their ip6tables twins, not as $cmd" >&2
	exit 2
	;;
esac
sbin=/usr/sbin

# legacy_rules, nft_rules [ARG...]: IPv4's and IPv6's rules in that iptables, or
# nothing where the kernel has none. iptables-legacy-save is never given a
# table: naming one would make the kernel create it. An nft save that hangs
# (iptables 1.8.3 could) is given up after 5 seconds, as upstream's is.
legacy_rules() {
	{ "$sbin/xtables-legacy-multi" iptables-save || true; "$sbin/xtables-legacy-multi" ip6tables-save || true; } 2>/dev/null
}
nft_rules() {
	{ timeout 5 "$sbin/xtables-nft-multi" iptables-save "$@" || true; timeout 5 "$sbin/xtables-nft-multi" ip6tables-save "$@" || true; } 2>/dev/null
}
hint='^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) '
if [ "$(nft_rules -t mangle | grep -cE "$hint")" -gt 0 ]; then
	mode=nft
elif [ "$(legacy_rules | grep -cE "$hint")" -gt 0 ]; then
	mode=legacy
elif [ "$(legacy_rules | grep -c '^-')" -gt "$(nft_rules | grep -c '^-')" ]; then
	mode=legacy
else
	mode=nft
fi

# Each link is replaced by a rename, so that a command started meanwhile
# (kube-proxy runs IPv4's and IPv6's side by side) finds either the wrapper
# or the chosen iptables. Where the image is read-only the links stay, and
# every command chooses again.
for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -sfn "xtables-$mode-multi" "$sbin/.$c.$$" && mv -fT "$sbin/.$c.$$" "$sbin/$c" || rm -f "$sbin/.$c.$$"
done 2>/dev/null
exec "$sbin/xtables-$mode-multi" "$cmd" "$@"
EOF
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -sfn iptables-wrapper "$r/usr/sbin/$t"
done
put "$r/etc/passwd" 644 <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
put "$r/etc/group" 644 <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
nsswitch "$r"
mkdir -p "$r/root" "$r/home/nonroot"

# kube-proxy (k8s.io/kubernetes build/server-image/Dockerfile with BINARY
# kube-proxy): FROM distroless-iptables, whose layers images.go puts first
# (the same layers, stored once by containerd), then kube-proxy at
# /usr/local/bin/kube-proxy; nothing of its own here.
mkdir -p "$rootfs/kube-proxy"

log "writing the archives"
(cd "$repo_root/hack/image" && "$GO" run ./clusterimages -rootfs "$rootfs" -tools "$bin" -o "$scratch/out")
rm -f "$out_dir"/*.tar "$out_dir/IMAGES" "$out_dir/.stamp"
mv "$scratch"/out/* "$out_dir/"
echo "$stamp" >"$out_dir/.stamp"
log "built $(wc -l <"$out_dir/IMAGES") images in $out_dir in $((SECONDS - start))s"
echo "$out_dir"
