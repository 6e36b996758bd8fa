package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
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

// versionFlag is --version as kube-proxy (component-base's verflag) takes
// it: true or false, or raw for every field.
type versionFlag string

func (v *versionFlag) String() string {
	if *v == "" {
		return "false"
	}
	return string(*v)
}

func (v *versionFlag) Set(s string) error {
	if s == "raw" {
		*v = versionFlag(s)
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true, false or raw")
	}
	*v = versionFlag(strconv.FormatBool(b))
	return nil
}

func (v *versionFlag) Type() string { return "version" }

// requested reports whether kpr should print its version and exit.
func (v versionFlag) requested() bool { return v == "true" || v == "raw" }

// text is what --version prints: versionString, or for raw a Go-syntax
// struct, as kube-proxy's --version=raw prints its version.Info.
func (v versionFlag) text() string {
	if v != "raw" {
		return versionString()
	}
	var commit, modified string
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	return fmt.Sprintf("version.Info{Version:%q, GitCommit:%q, GitTreeModified:%q, GoVersion:%q, Compiler:%q, Platform:%q}",
		version, commit, modified, runtime.Version(), runtime.Compiler, runtime.GOOS+"/"+runtime.GOARCH)
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
