package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is kpr's release, stamped at build time by `make build` and the
// Dockerfile: -ldflags "-X main.version=v0.3.0". A plain `go build` leaves
// "dev".
var version = "dev"

// versionString is what `kpr --version` prints: the stamped version, then
// the commit Go recorded in the binary when it was built from a checkout
// (debug.ReadBuildInfo; absent under -buildvcs=false), then the Go version.
func versionString() string {
	s := "kpr " + version
	if info, ok := debug.ReadBuildInfo(); ok {
		s += vcsSuffix(info.Settings)
	}
	return s + fmt.Sprintf(" (%s %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// vcsSuffix renders the VCS settings of a build: " commit 1a2b3c4d5e6f"
// with "-dirty" for a tree with uncommitted changes, or "" without them.
func vcsSuffix(settings []debug.BuildSetting) string {
	var rev string
	var dirty bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return " commit " + rev
}
