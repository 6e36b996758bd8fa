package metrics

import (
	"regexp"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo is what kubernetes_build_info says of the running binary.
// kube-proxy fills it from the Kubernetes release it was built from;
// kpr fills it with its own, so that a fleet view shows which kpr runs.
type BuildInfo struct {
	// GitVersion is the release, "v0.3.0" (or "dev" for a plain build);
	// Major and Minor are taken from it.
	GitVersion string
	// GitCommit is the commit built, "" if unknown; GitTreeState is
	// "clean" or "dirty" when it is known.
	GitCommit, GitTreeState string
	// BuildDate is when the commit was made (RFC 3339), "" if unknown.
	BuildDate string
}

var buildInfoLabels = []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"}

func newBuildInfo() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kubernetes_build_info",
		Help: "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
	}, buildInfoLabels)
}

// releaseVersion matches "v1.2.3" and its pre-release and build suffixes.
var releaseVersion = regexp.MustCompile(`^v(\d+)\.(\d+)\.\d+`)

// SetBuildInfo sets kubernetes_build_info to 1 for b, replacing what an
// earlier call set.
func (m *Metrics) SetBuildInfo(b BuildInfo) {
	var major, minor string
	if v := releaseVersion.FindStringSubmatch(b.GitVersion); v != nil {
		major, minor = v[1], v[2]
	}
	m.BuildInfo.Reset()
	m.BuildInfo.WithLabelValues(major, minor, b.GitVersion, b.GitCommit, b.GitTreeState, b.BuildDate,
		runtime.Version(), runtime.Compiler, runtime.GOOS+"/"+runtime.GOARCH).Set(1)
}
