package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// kprLog builds the logger `kpr run` builds from args, runs fn with it and
// returns the lines it wrote.
func kprLog(t *testing.T, args []string, fn func(log *zap.Logger)) []string {
	t.Helper()
	_, g, _, err := parseRun(t, append([]string{"run"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log, err := g.loggerTo(zapcore.AddSync(&buf))
	if err != nil {
		t.Fatal(err)
	}
	fn(log)
	if buf.Len() == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
}

// parseJSONLines decodes each line as a JSON object, as a log pipeline does.
func parseJSONLines(t *testing.T, lines []string) []map[string]any {
	t.Helper()
	out := make([]map[string]any, len(lines))
	for i, l := range lines {
		if err := json.Unmarshal([]byte(l), &out[i]); err != nil {
			t.Fatalf("line %d is not a JSON object: %v\n%s", i, err, l)
		}
	}
	return out
}

// writeKubeProxyConfig writes a KubeProxyConfiguration with the given
// logging section.
func writeKubeProxyConfig(t *testing.T, logging string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.conf")
	body := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n" + logging
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestJSONLinesAreComponentBases: a pipeline built for kube-proxy's JSON
// lines (component-base's format) finds the same keys, of the same types,
// in kpr's: ts as milliseconds since the epoch, caller, msg, v on info
// lines, err on error lines, the fields at the top level, durations as
// Go writes them; and nothing else (no level, no stack trace).
func TestJSONLinesAreComponentBases(t *testing.T) {
	before := time.Now()
	lines := kprLog(t, []string{"--log-format=json"}, func(log *zap.Logger) {
		log.Info("Synced the dataplane", zap.String("service", "shop/web"), zap.Duration("took", 1500*time.Millisecond))
		log.Error("Syncing the dataplane failed", zap.Error(errors.New("map full")), zap.Int("queued", 3))
	})
	after := time.Now()
	parsed := parseJSONLines(t, lines)
	if len(parsed) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(parsed), strings.Join(lines, "\n"))
	}
	info, failed := parsed[0], parsed[1]
	for _, tc := range []struct {
		line map[string]any
		keys []string
	}{
		{info, []string{"caller", "msg", "service", "took", "ts", "v"}},
		{failed, []string{"caller", "err", "msg", "queued", "ts"}},
	} {
		if got := slices.Sorted(maps.Keys(tc.line)); !slices.Equal(got, tc.keys) {
			t.Errorf("%q has the keys %q, want %q", tc.line["msg"], got, tc.keys)
		}
		ts, ok := tc.line["ts"].(float64)
		if !ok || ts < float64(before.UnixMilli()) || ts > float64(after.UnixMilli()+1) {
			t.Errorf("ts = %v, want a number of milliseconds since the epoch between %d and %d", tc.line["ts"], before.UnixMilli(), after.UnixMilli())
		}
		if c, _ := tc.line["caller"].(string); !strings.HasPrefix(c, "kpr/logging_test.go:") {
			t.Errorf("caller = %v, want kpr/logging_test.go:<line>", tc.line["caller"])
		}
	}
	if info["msg"] != "Synced the dataplane" || info["v"] != 0.0 || info["service"] != "shop/web" || info["took"] != "1.5s" {
		t.Errorf("info line: msg %v v %v service %v took %v, want the message, v 0, service shop/web, took 1.5s",
			info["msg"], info["v"], info["service"], info["took"])
	}
	if failed["err"] != "map full" || failed["queued"] != 3.0 {
		t.Errorf("error line: err %v queued %v, want err \"map full\", queued 3", failed["err"], failed["queued"])
	}
}

// TestVerbosityIsKlogs: -v, --log-level and the file's logging.verbosity
// show the V(n) lines up to their verbosity, each JSON line saying its
// own; kpr's Debug lines are V(4); --log-level wins over -v, and -v over
// the file.
func TestVerbosityIsKlogs(t *testing.T) {
	file6 := writeKubeProxyConfig(t, "  verbosity: 6\n")
	logEvery := func(log *zap.Logger) {
		for v := 10; v >= 0; v-- {
			if v == 1 {
				continue // zap's Debug level, which kpr's logger writes as V(4)
			}
			log.Log(zapcore.Level(-v), "a V line", zap.Int("at", v)) // zapr's (and component-base's) V(v)
		}
		log.Debug("a debug line")
		log.Warn("a warning")
	}
	for _, tc := range []struct {
		args      []string
		wantUpTo  int // the deepest V line shown; -1: none
		wantDebug bool
	}{
		{nil, 0, false},
		{[]string{"-v=2"}, 2, false},
		{[]string{"-v", "4"}, 4, true},
		{[]string{"-v=5"}, 5, true},
		{[]string{"--log-level=debug"}, 4, true},
		{[]string{"--log-level=7"}, 7, true},
		{[]string{"--v=5", "--log-level=error"}, -1, false},
		{[]string{"--config=" + file6}, 6, true},
		{[]string{"--config=" + file6, "-v=3"}, 3, false},
	} {
		var shown []int
		debugShown := false
		for _, line := range parseJSONLines(t, kprLog(t, append([]string{"--log-format=json"}, tc.args...), logEvery)) {
			switch line["msg"] {
			case "a V line":
				if line["v"] != line["at"] {
					t.Errorf("%q: the V(%v) line says v %v", tc.args, line["at"], line["v"])
				}
				shown = append(shown, int(line["at"].(float64)))
			case "a debug line":
				debugShown = true
				if line["v"] != float64(debugVerbosity) {
					t.Errorf("%q: a Debug line says v %v, want %d", tc.args, line["v"], debugVerbosity)
				}
			case "a warning":
				if line["v"] != 0.0 {
					t.Errorf("%q: a warning says v %v, want 0 (as klog's Warning in component-base)", tc.args, line["v"])
				}
			}
		}
		var want []int
		for v := tc.wantUpTo; v >= 0; v-- {
			if v != 1 {
				want = append(want, v)
			}
		}
		if !slices.Equal(shown, want) || debugShown != tc.wantDebug {
			t.Errorf("%q: V lines %v and debug %v shown, want V lines %v and debug %v", tc.args, shown, debugShown, want, tc.wantDebug)
		}
	}
}

// TestClientGoLinesFollowVerbosity: client-go logs through klog; -v shows
// its V(n) lines up to n, as kube-proxy's -v does, under logger client-go,
// with its errors under err.
func TestClientGoLinesFollowVerbosity(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want []string
	}{
		{"-v=0", []string{"watch failed"}},
		{"-v=6", []string{"GET /api/v1/services", "watch failed"}},
	} {
		lines := parseJSONLines(t, kprLog(t, []string{"--log-format=json", tc.v}, func(*zap.Logger) {
			klog.V(6).InfoS("GET /api/v1/services", "status", 200)
			klog.V(7).InfoS("response body", "bytes", 1024)
			klog.ErrorS(errors.New("connection refused"), "watch failed")
		}))
		var got []string
		for _, l := range lines {
			if !slices.Contains([]any{"GET /api/v1/services", "response body", "watch failed"}, l["msg"]) {
				continue // another test's client-go
			}
			got = append(got, l["msg"].(string))
			if l["logger"] != "client-go" {
				t.Errorf("%s: %q has logger %v, want client-go", tc.v, l["msg"], l["logger"])
			}
			if l["msg"] == "GET /api/v1/services" && (l["v"] != 6.0 || l["status"] != 200.0) {
				t.Errorf("%s: klog's V(6) line says v %v status %v, want 6 and 200", tc.v, l["v"], l["status"])
			}
			if l["msg"] == "watch failed" && l["err"] != "connection refused" {
				t.Errorf("%s: klog's error line has err %v", tc.v, l["err"])
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: client-go's lines %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestWarningsAndErrorsCarryNoStackTrace: in either format an entry is one
// line; a stack trace under each warning or error buried the log.
func TestWarningsAndErrorsCarryNoStackTrace(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		lines := kprLog(t, []string{"--log-format=" + format}, func(log *zap.Logger) {
			log.Warn("a warning", zap.Error(errors.New("why")))
			log.Error("an error", zap.Error(errors.New("why")))
		})
		if len(lines) != 2 || strings.Contains(strings.Join(lines, "\n"), "stacktrace") {
			t.Errorf("%s: a warning and an error printed %d lines, want 2 with no stack trace:\n%s", format, len(lines), strings.Join(lines, "\n"))
		}
	}
}

// TestBurstOfOneMessageKeepsEveryLine: no line of a burst that shares one
// message is dropped (zap's production sampling kept one in a hundred past
// the first hundred a second).
func TestBurstOfOneMessageKeepsEveryLine(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		lines := kprLog(t, []string{"--log-format=" + format}, func(log *zap.Logger) {
			for i := range 200 {
				log.Info("Refused a Service", zap.Int("service", i))
			}
		})
		if len(lines) != 200 {
			t.Errorf("%s: a burst of 200 lines left %d", format, len(lines))
		}
	}
}

// TestLoggingFormat: kube-proxy's --logging-format and its file's
// logging.format choose text or json, as kpr's --log-format, which wins;
// the flag wins over the file, as in kube-proxy. Text lines name their
// level, V(n) lines as Vn.
func TestLoggingFormat(t *testing.T) {
	textFile := writeKubeProxyConfig(t, "  format: text\n")
	for _, tc := range []struct {
		args     []string
		wantJSON bool
	}{
		{nil, true},
		{[]string{"--logging-format=text"}, false},
		{[]string{"--logging-format=json"}, true},
		{[]string{"--logging-format=text", "--log-format=json"}, true},
		{[]string{"--log-format=console"}, false},
		{[]string{"--log-format=text"}, false},
		{[]string{"--config=" + textFile}, false},
		{[]string{"--config=" + textFile, "--logging-format=json"}, true},
	} {
		lines := kprLog(t, append([]string{"-v=4"}, tc.args...), func(log *zap.Logger) {
			log.Info("kpr starting")
			log.Debug("a debug line")
		})
		if len(lines) != 2 {
			t.Errorf("%q: %d lines, want 2", tc.args, len(lines))
			continue
		}
		isJSON := json.Valid([]byte(lines[0]))
		if isJSON != tc.wantJSON {
			t.Errorf("%q: JSON %v, want %v:\n%s", tc.args, isJSON, tc.wantJSON, lines[0])
		}
		if !isJSON && (!strings.Contains(lines[0], "\tINFO\t") || !strings.Contains(lines[1], "\tV4\t")) {
			t.Errorf("%q: text lines do not name their levels INFO and V4:\n%s", tc.args, strings.Join(lines, "\n"))
		}
	}
}

func TestBadLoggingSettingsSayWhatToGive(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--logging-format=yaml"}, `--logging-format "yaml": want text or json`},
		{[]string{"--config=" + writeKubeProxyConfig(t, "  format: yaml\n")}, `logging.format "yaml": want text or json`},
		{[]string{"-v=-1"}, "want a klog verbosity"},
	} {
		if _, _, _, err := parseRun(t, append([]string{"run"}, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want one saying %q", tc.args, err, tc.want)
		}
	}
	for _, g := range []globalFlags{{logLevel: "loud", logFormat: "json"}, {logLevel: "200", logFormat: "json"}, {logLevel: "info", logFormat: "xml"}} {
		if _, err := g.loggerTo(zapcore.AddSync(&bytes.Buffer{})); err == nil || !strings.Contains(err.Error(), "want") {
			t.Errorf("--log-level %q --log-format %q: err %v, want one saying what to give", g.logLevel, g.logFormat, err)
		}
	}
}
