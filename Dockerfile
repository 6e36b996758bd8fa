# kpr node image. The BPF objects are committed, so the build needs no clang.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) .
#
# `make image` builds the same image without a container daemon (an OCI
# archive from Debian's packages, hack/image); keep the two in step: the
# binary at /usr/local/bin/kpr, ENTRYPOINT ["kpr"] (deploy/'s DaemonSet
# passes only args), the same runtime packages, the same labels.
#
# Base images are pinned by version. Their digests could not be verified on
# the machine this was written on (no registry is reachable there), so none
# is given rather than an unverified one; pin them with
#   docker buildx imagetools inspect golang:1.26.8-trixie
# and FROM golang:1.26.8-trixie@sha256:<digest> where a registry is at hand.
# 1.26.8 is go.mod's toolchain line (tests/release checks that they agree);
# Debian 13.8 is the trixie point release the runtime packages of
# `make image` came from.

FROM golang:1.26.8-trixie AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The version `kpr --version` prints and the image's label.
ARG VERSION=dev
# make build: static (CGO_ENABLED=0), -trimpath, -s -w and the version stamp,
# the flags of every kpr binary (Makefile).
RUN make build VERSION="${VERSION}" KPR_BIN=/out/kpr

FROM debian:13.8-slim
# The iptables fallback mode runs iptables-nft or iptables-legacy (kpr picks
# the node's), ipset and conntrack, the nftables mode nft; the slim image
# already has sh, mount and mountpoint, which the DaemonSet's init container runs to mount bpffs.
# The package's postinst points iptables at iptables-nft, as in `make image`.
RUN apt-get update \
	&& apt-get install -y --no-install-recommends iptables ipset conntrack nftables \
	&& rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man
COPY --from=build /out/kpr /usr/local/bin/kpr
ARG VERSION=dev
LABEL org.opencontainers.image.title="kpr" \
	org.opencontainers.image.description="eBPF kube-proxy replacement" \
	org.opencontainers.image.source="https://github.com/kpr-io/kpr" \
	org.opencontainers.image.version="${VERSION}"
ENTRYPOINT ["kpr"]
