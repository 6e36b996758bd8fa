package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// statusResult is the part of `kpr status -o json` the test reads.
type statusResult struct {
	Daemon *struct {
		Mode    string `json:"mode"`
		Reason  string `json:"reason"`
		Watcher struct {
			LastSuccessfulSync *struct {
				At time.Time `json:"at"`
			} `json:"lastSuccessfulSync"`
			API struct {
				Connected         bool       `json:"connected"`
				DisconnectedSince *time.Time `json:"disconnectedSince"`
				LastError         string     `json:"lastError"`
			} `json:"api"`
		} `json:"watcher"`
	} `json:"daemon"`
	DaemonError string `json:"daemonError"`
	// Exit is kpr status's exit code.
	Exit  int `json:"-"`
	Links []struct {
		Type     string `json:"type"`
		Program  string `json:"program"`
		CgroupID uint64 `json:"cgroupId"`
		Error    string `json:"error"`
	} `json:"links"`
	Maps []struct {
		Map        string `json:"map"`
		Entries    int    `json:"entries"`
		MaxEntries int    `json:"maxEntries"`
	} `json:"maps"`
}

func (f *fixture) status(t *testing.T) statusResult {
	t.Helper()
	out, code := f.kprStatus(t, "-o", "json", "--metrics-address", f.kpr.MetricsAddr)
	var st statusResult
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("parse kpr status output: %v\n%s", err, out)
	}
	st.Exit = code
	return st
}

// testStatus: `kpr status` shows the running daemon's mode, syncs and API
// connection, the pinned links on the test's cgroup and the map fill; with
// the daemon stopped it says so and still shows the pins.
func testStatus(t *testing.T, f *fixture, _ string) {
	st := f.status(t)
	d := st.Daemon
	if d == nil {
		t.Fatalf("status found no daemon: %s", st.DaemonError)
	}
	if d.Mode != "ebpf" || d.Reason == "" || d.Watcher.LastSuccessfulSync == nil || !d.Watcher.API.Connected || st.Exit != 0 {
		t.Errorf("daemon status = %+v, exit %d; want mode ebpf with a reason, a successful sync, the API connected, exit 0", *d, st.Exit)
	}
	checkPins := func(st statusResult) {
		t.Helper()
		var cg unix.Stat_t
		if err := unix.Stat(f.cgroup.Path, &cg); err != nil {
			t.Fatal(err)
		}
		cgroupID := cg.Ino
		connect := false
		for _, l := range st.Links {
			if l.Error != "" || l.CgroupID != cgroupID {
				t.Errorf("link %+v: want no error and the test's cgroup %d", l, cgroupID)
			}
			connect = connect || (l.Type == "CGroupInet4Connect" && strings.Contains(l.Program, "connect4"))
		}
		if !connect {
			t.Errorf("links %+v: no connect4 program attached", st.Links)
		}
		services := false
		for _, m := range st.Maps {
			if m.Map == "kpr_services" {
				services = m.Entries > 0 && m.MaxEntries >= m.Entries
			}
		}
		if !services {
			t.Errorf("maps %+v: want kpr_services with entries, within capacity", st.Maps)
		}
	}
	checkPins(st)

	if err := f.kpr.Stop(); err != nil {
		t.Fatal(err)
	}
	st = f.status(t)
	if st.Daemon != nil || !strings.Contains(st.DaemonError, "no kpr daemon answers") || st.Exit != 3 {
		t.Errorf("with kpr stopped: daemon %+v, error %q, exit %d; want it reported not running, exit 3", st.Daemon, st.DaemonError, st.Exit)
	}
	checkPins(st)
	if err := f.kpr.Restart(); err != nil {
		t.Fatal(err)
	}
	f.waitHealthy()
}

// testStatusAPIOutage: with the API server stopped, `kpr status` says the
// API is not connected, since when and why, within seconds (while kpr's
// client still holds its watch calls through the outage); once the API
// server is back it says connected again.
func testStatusAPIOutage(t *testing.T, f *fixture, _ string) {
	stopped := time.Now() // the server goes while StopAPIServer runs
	if err := f.cluster.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = f.cluster.StartAPIServer()
		}
	}()
	waitUntil(t, 15*time.Second, "kpr status reports the API disconnected", func() error {
		st := f.status(t)
		api := st.Daemon.Watcher.API
		if api.Connected || api.DisconnectedSince == nil || api.LastError == "" || st.Exit != 4 {
			return fmt.Errorf("api %+v, exit %d (want 4, unhealthy)", api, st.Exit)
		}
		if api.DisconnectedSince.Before(stopped) {
			return fmt.Errorf("disconnected since %s, before the API server stopped at %s", api.DisconnectedSince, stopped)
		}
		return nil
	})
	t.Logf("status reported the API disconnected %s after it stopped", time.Since(stopped).Round(time.Second))
	if err := f.cluster.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	waitUntil(t, 60*time.Second, "kpr status reports the API connected again", func() error {
		if api := f.status(t).Daemon.Watcher.API; !api.Connected {
			return fmt.Errorf("api %+v", api)
		}
		return nil
	})
}
