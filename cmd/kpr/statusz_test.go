package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// /statusz is the standard page (as kube-proxy 1.37's), and kpr's own
// document is at /kpr/status.
func TestStatuszIsTheStandardPage(t *testing.T) {
	h := statuszHandler(time.Now().Add(-3723 * time.Second))
	get := func(accept string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, statuszPath, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, accept := range []string{"", "text/plain", "*/*"} {
		rec := get(accept)
		body := rec.Body.String()
		for _, want := range []string{"kpr statusz\nWarning: This endpoint is not meant to be machine parseable", "Up: 1 hr 02 min 03 sec", "Go version: go", "Binary version: ", "Paths: /healthz"} {
			if !strings.Contains(body, want) {
				t.Errorf("Accept %q: page lacks %q:\n%s", accept, want, body)
			}
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("Accept %q: Content-Type %q", accept, ct)
		}
	}
	rec := get("application/json;v=v1;g=config.k8s.io;as=Statusz")
	var page statuszV1
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || page.Kind != "Statusz" || page.ComponentName != "kpr" || page.UpTime != "1 hr 02 min 03 sec" {
		t.Errorf("structured page %+v (%v):\n%s", page, err, rec.Body.String())
	}
	if rec := get("application/xml"); rec.Code != http.StatusNotAcceptable {
		t.Errorf("Accept application/xml: %d, want 406", rec.Code)
	}
}
