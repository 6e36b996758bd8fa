package metrics

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestSockStatsCollectorExportsEveryHookAtScrape(t *testing.T) {
	m := New()
	n := uint64(0)
	m.Registry.MustRegister(NewSockStatsCollector(func(emit func(SockHookCounts)) error {
		n++ // read at every scrape, not once
		emit(SockHookCounts{Hook: "connect4", Translated: 5 * n, Rejected: 2, Passed: 7, Bypassed: 4})
		emit(SockHookCounts{Hook: "recvmsg6", Translated: 1, Passed: 3})
		return nil
	}))
	get(t, m.Handler("ebpf"), "/metrics")
	code, body := get(t, m.Handler("ebpf"), "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics answered %d", code)
	}
	for _, series := range []string{
		"# TYPE kpr_sock_translations_total counter",
		`kpr_sock_translations_total{hook="connect4"} 10`,
		`kpr_sock_rejects_total{hook="connect4"} 2`,
		`kpr_sock_passes_total{hook="connect4"} 7`,
		`kpr_sock_bypasses_total{hook="connect4"} 4`,
		`kpr_sock_translations_total{hook="recvmsg6"} 1`,
		`kpr_sock_passes_total{hook="recvmsg6"} 3`,
	} {
		if !strings.Contains(body, series+"\n") {
			t.Errorf("scrape lacks %q", series)
		}
	}
}

func TestSockStatsCollectorFailsTheScrapeOnReadError(t *testing.T) {
	m := New()
	m.Registry.MustRegister(NewSockStatsCollector(func(func(SockHookCounts)) error {
		return errors.New("map gone")
	}))
	if code, body := get(t, m.Handler("ebpf"), "/metrics"); code == http.StatusOK {
		t.Errorf("scrape answered 200 despite an unreadable counter map:\n%s", body)
	}
}
