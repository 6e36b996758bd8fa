package helm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"sigs.k8s.io/yaml"

	"github.com/kpr-io/kpr/tests/deploy"
)

// TestPackageChartStampsTheRelease packages the chart as `make release`
// does for the tag v0.9.1: the archive's Chart.yaml says version 0.9.1 and
// appVersion v0.9.1, the chart rendered from the archive with its defaults
// runs the image ghcr.io/kpr-io/kpr:v0.9.1, and the committed Chart.yaml
// is left as it was.
func TestPackageChartStampsTheRelease(t *testing.T) {
	const release = "v0.9.1"
	chartFile := filepath.Join(deploy.ChartDir(), "Chart.yaml")
	before, err := os.ReadFile(chartFile)
	if err != nil {
		t.Fatal(err)
	}

	archive, err := PackageChart(deploy.ChartDir(), release, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Base(archive); got != "kpr-0.9.1.tgz" {
		t.Errorf("archive %s, want kpr-0.9.1.tgz, as helm package names it", got)
	}
	var meta chart.Metadata
	if err := yaml.Unmarshal(fileInTgz(t, archive, "kpr/Chart.yaml"), &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Version != "0.9.1" || meta.AppVersion != release {
		t.Errorf("the archive's Chart.yaml has version %q, appVersion %q; want 0.9.1 and %s", meta.Version, meta.AppVersion, release)
	}

	ds := byKind(renderChartAt(t, archive, deploy.Namespace, nil, oldestKube))["DaemonSet/kpr"]
	if ds == nil {
		t.Fatal("the packaged chart renders no DaemonSet kpr")
	}
	if img := container(t, ds, "containers", "kpr")["image"]; img != "ghcr.io/kpr-io/kpr:"+release {
		t.Errorf("the packaged chart's default image is %v, want ghcr.io/kpr-io/kpr:%s", img, release)
	}
	if v := ds.GetLabels()["app.kubernetes.io/version"]; v != release {
		t.Errorf("label app.kubernetes.io/version %q, want %s", v, release)
	}

	after, err := os.ReadFile(chartFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("packaging changed the committed %s", chartFile)
	}
}

// TestChartVersion: a version that is no release tag is refused rather
// than packaged, unless dev, which gives the chart a version that sorts
// before every release.
func TestChartVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		dev     bool
		want    string // "" for an error
	}{
		{"v0.9.1", false, "0.9.1"},
		{"v1.2.3-rc.1", false, "1.2.3-rc.1"},
		{"v0.9.1", true, "0.9.1"},
		{"0.9.1", false, ""}, // kpr's tags start with v
		{"v0.9", false, ""},  // which Helm would take as 0.9.0
		{"3bc07f7-dirty", false, ""},
		{"3bc07f7-dirty", true, "0.0.0-3bc07f7-dirty"},
	} {
		got, err := ChartVersion(tc.version, tc.dev)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("ChartVersion(%q, dev %v) = %q, %v; want %q", tc.version, tc.dev, got, err, tc.want)
		}
	}
	if path, err := PackageChart(deploy.ChartDir(), "3bc07f7", t.TempDir(), false); err == nil {
		t.Errorf("PackageChart packaged the untagged version 3bc07f7 as %s", path)
	}
}

// fileInTgz returns the contents of name in the gzipped tar archive.
func fileInTgz(t *testing.T, archive, name string) []byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s has no %s", archive, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}
