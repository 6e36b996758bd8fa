package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

func maglevDumpFixture() ([]maps.Service, map[maps.VIPKey]maps.MaglevTable) {
	key := maps.VIPKey{VIP: maps.VIP{Addr: netip.MustParseAddr("192.0.2.80"), Port: 80, Proto: dataplane.TCP}}
	other := maps.VIPKey{VIP: maps.VIP{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: dataplane.TCP}}
	svcs := []maps.Service{
		{VIPKey: other, Kind: dataplane.ClusterIP, Backends: []dataplane.Backend{{Addr: netip.MustParseAddr("10.244.0.1"), Port: 8080}}},
		{VIPKey: key, Kind: dataplane.LoadBalancer, Backends: []dataplane.Backend{
			{Addr: netip.MustParseAddr("10.244.0.1"), Port: 8080}, {Addr: netip.MustParseAddr("10.244.0.2"), Port: 8080}}},
	}
	tables := map[maps.VIPKey]maps.MaglevTable{key: {VIPKey: key, Size: 251, Shares: []maps.MaglevShare{
		{Backend: netip.MustParseAddrPort("10.244.0.2:8080"), ID: 2, Slots: 126},
		{Backend: netip.MustParseAddrPort("10.244.0.1:8080"), ID: 1, Slots: 124},
		{ID: 9, Slots: 1},
	}}}
	return svcs, tables
}

// The table output lists every backend's slots under its frontend, after
// the services.
func TestDumpShowsMaglevShares(t *testing.T) {
	svcs, tables := maglevDumpFixture()
	var buf bytes.Buffer
	if err := writeMaglevTable(&buf, tables, svcs); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{`MAGLEV TABLE OF`, `192.0.2.80:80\s+TCP\s+internal\s+251\s+10\.244\.0\.2:8080\s+126\s+50\.2%`,
		`\n\s+10\.244\.0\.1:8080\s+124\s+49\.4%`, `\(missing backend id 9\)\s+1\s`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "10.96.0.1") {
		t.Errorf("a frontend without a table is listed:\n%s", out)
	}
	buf.Reset()
	if err := writeMaglevTable(&buf, nil, svcs); err != nil || buf.Len() != 0 {
		t.Errorf("without tables: %q, %v; want nothing", buf.String(), err)
	}
}

func TestDumpJSONCarriesMaglevShares(t *testing.T) {
	svcs, tables := maglevDumpFixture()
	var buf bytes.Buffer
	if err := writeJSON(&buf, dumpServices(svcs, tables)); err != nil {
		t.Fatal(err)
	}
	var got []dumpService
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Maglev != nil || got[1].Maglev == nil {
		t.Fatalf("services %+v: want a table for the second only", got)
	}
	if m := got[1].Maglev; m.TableSize != 251 || len(m.Shares) != 3 || m.Shares[0] != (dumpMaglevShare{Backend: "10.244.0.2:8080", Slots: 126}) {
		t.Errorf("maglev = %+v", m)
	}
}
