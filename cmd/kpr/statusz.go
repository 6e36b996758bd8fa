package main

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"runtime"
	"strings"
	"time"
)

// statuszPath serves the page every Kubernetes component (kube-proxy
// 1.37 included) serves there, from component-base's zpages: a plain-text
// summary for people, or its structured form for a client that asks for
// it. kpr writes the same page itself: component-base's renders it through
// html/template, whose reflection would keep the linker from dropping
// unused methods (megabytes of binary).
const statuszPath = "/statusz"

// statuszPaths are the paths the metrics address serves, which the page
// lists.
var statuszPaths = []string{"/healthz", "/kpr/status", "/livez", "/metrics", "/proxyMode", statuszPath}

// statuszV1 is the structured page (component-base's statusz v1 Statusz).
type statuszV1 struct {
	Kind             string   `json:"kind"`
	APIVersion       string   `json:"apiVersion"`
	ComponentName    string   `json:"componentName"`
	StartTime        string   `json:"startTime"`
	UpTime           string   `json:"upTime"`
	GoVersion        string   `json:"goVersion"`
	BinaryVersion    string   `json:"binaryVersion"`
	EmulationVersion string   `json:"emulationVersion,omitempty"`
	Paths            []string `json:"paths"`
}

// statuszHandler serves the page of a process started at started.
func statuszHandler(started time.Time) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page := statuszV1{Kind: "Statusz", APIVersion: "config.k8s.io/v1", ComponentName: "kpr",
			StartTime: started.Format(time.UnixDate), UpTime: upTime(time.Since(started)),
			GoVersion: runtime.Version(), BinaryVersion: version, Paths: statuszPaths}
		switch statuszFormat(r.Header.Get("Accept")) {
		case "json":
			w.Header().Set("Content-Type", "application/json;g=config.k8s.io;v=v1;as=Statusz")
			_ = json.NewEncoder(w).Encode(page)
		case "text":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "\n%s statusz\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n\n", page.ComponentName)
			fmt.Fprintf(w, "Started: %s\nUp: %s\nGo version: %s\nBinary version: %s\nPaths: %s\n",
				page.StartTime, page.UpTime, page.GoVersion, page.BinaryVersion, strings.Join(page.Paths, " "))
		default:
			http.Error(w, "media type not acceptable, must be: text/plain or application/json;v=v1;g=config.k8s.io;as=Statusz", http.StatusNotAcceptable)
		}
	})
}

// statuszFormat picks the page's form from an Accept header as
// component-base does: text for text/plain, */* or none, the structured
// page for application/json with as=Statusz, "" for anything else.
func statuszFormat(accept string) string {
	if strings.TrimSpace(accept) == "" {
		return "text"
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch {
		case mt == "text/plain" || mt == "*/*" || mt == "text/*":
			return "text"
		case mt == "application/json" && params["as"] == "Statusz" && (params["g"] == "" || params["g"] == "config.k8s.io"):
			return "json"
		}
	}
	return ""
}

// upTime is component-base's rendering: "1 hr 02 min 03 sec".
func upTime(d time.Duration) string {
	s := int64(d.Seconds())
	return fmt.Sprintf("%d hr %02d min %02d sec", s/3600, (s/60)%60, s%60)
}
