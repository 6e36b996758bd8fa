// Command package-chart packages deploy/helm/kpr for `make release`, with
// version and appVersion set from the release's VERSION (helm.PackageChart):
//
//	go run ./package-chart -chart ../../../deploy/helm/kpr -version v0.9.1 -o DIR
//
// writes DIR/kpr-0.9.1.tgz. It lives in the chart tests' module so that
// Helm's library stays out of kpr's product go.mod; no helm binary is
// needed.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kpr-io/kpr/tests/deploy/helm"
)

func main() {
	chartDir := flag.String("chart", "", "the chart's directory (deploy/helm/kpr)")
	version := flag.String("version", "", "the release, v<semver> (make release passes VERSION)")
	out := flag.String("o", "", "directory to write <chart>-<version>.tgz into")
	dev := flag.Bool("dev", false, "take a version that is no tag, as chart version 0.0.0-<version> (make release with RELEASE_ALLOW_DIRTY=1)")
	flag.Parse()
	if *chartDir == "" || *version == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: package-chart -chart DIR -version v0.x.y -o DIR (make release sets them)")
		os.Exit(2)
	}
	path, err := helm.PackageChart(*chartDir, *version, *out, *dev)
	if err != nil {
		fmt.Fprintf(os.Stderr, "package-chart: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "package-chart: wrote %s\n", path)
}
