// Package helm packages kpr's Helm chart for a release (PackageChart, which
// `make release` runs through ./package-chart), and its tests render
// deploy/helm/kpr with Helm's Go library, as `helm template` does, check
// the result against a real API server, and check that the chart's
// defaults deploy what the kustomize base does.
package helm

import (
	"fmt"
	"strings"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// PackageChart packages the chart in dir as `helm package` does, stamped
// with the release version (a git tag, v0.9.1): the chart's version is
// 0.9.1, since Helm wants a bare semver there, and its appVersion v0.9.1,
// the image tag and what `kpr --version` prints, so that the chart's
// default image is the release's. It writes <name>-0.9.1.tgz into outDir
// and returns its path. The chart in dir is left as it is: only the
// archive carries the stamped Chart.yaml.
//
// With dev (make release with RELEASE_ALLOW_DIRTY=1), a version that is
// no tag, as git describe prints it off an untagged commit, is taken too.
func PackageChart(dir, version, outDir string, dev bool) (string, error) {
	chartVersion, err := ChartVersion(version, dev)
	if err != nil {
		return "", err
	}
	chrt, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load the chart %s: %w", dir, err)
	}
	chrt.Metadata.Version = chartVersion
	chrt.Metadata.AppVersion = version
	path, err := chartutil.Save(chrt, outDir)
	if err != nil {
		return "", fmt.Errorf("package the chart as version %s: %w", version, err)
	}
	return path, nil
}

// ChartVersion is the chart version of kpr's version: the tag without its
// v (v0.9.1 is 0.9.1). Helm itself would take "0.9" as 0.9.0; a release's
// tag has all three parts. With dev, a version that is no tag is put
// after 0.0.0- (3bc07f7-dirty is 0.0.0-3bc07f7-dirty), a semver
// pre-release that sorts before every release.
func ChartVersion(version string, dev bool) (string, error) {
	if v, ok := strings.CutPrefix(version, "v"); ok {
		if _, err := semver.StrictNewVersion(v); err == nil {
			return v, nil
		}
	}
	if dev {
		v := "0.0.0-" + version
		if _, err := semver.StrictNewVersion(v); err == nil {
			return v, nil
		}
	}
	return "", fmt.Errorf("version %q: want v<major>.<minor>.<patch>, the tag of a kpr release", version)
}
