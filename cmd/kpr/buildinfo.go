package main

import (
	"runtime/debug"

	"github.com/kpr-io/kpr/metrics"
)

// buildInfo is kubernetes_build_info for this binary: kpr's stamped
// version, and the commit, tree state and commit time Go recorded when it
// was built from a checkout (empty under -buildvcs=false).
func buildInfo() metrics.BuildInfo {
	b := metrics.BuildInfo{GitVersion: version}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.GitCommit = s.Value
		case "vcs.time":
			b.BuildDate = s.Value
		case "vcs.modified":
			b.GitTreeState = "clean"
			if s.Value == "true" {
				b.GitTreeState = "dirty"
			}
		}
	}
	return b
}
