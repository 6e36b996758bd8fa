# kpr node image. The BPF objects are committed, so the build needs no clang.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The version `kpr --version` prints: docker build --build-arg VERSION=$(git describe --tags).
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/kpr ./cmd/kpr

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/kpr /usr/bin/kpr
ENTRYPOINT ["/usr/bin/kpr"]
