package main

import (
	"net/netip"
	"testing"
)

func TestParseExplainTarget(t *testing.T) {
	for _, c := range []struct {
		in   string
		want target
		err  bool
	}{
		{in: "shop/web", want: target{namespace: "shop", name: "web"}},
		{in: "shop/web:https", want: target{namespace: "shop", name: "web", port: "https"}},
		{in: "10.96.0.10:80", want: target{frontend: netip.MustParseAddrPort("10.96.0.10:80")}},
		{in: "[fd00::10]:443", want: target{frontend: netip.MustParseAddrPort("[fd00::10]:443")}},
		{in: "[::ffff:10.96.0.10]:80", want: target{frontend: netip.MustParseAddrPort("10.96.0.10:80")}},
		{in: "web", err: true},
		{in: "/web", err: true},
		{in: "shop/", err: true},
	} {
		got, err := parseTarget(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("parseTarget(%q) = %+v, %v; want %+v, error %v", c.in, got, err, c.want, c.err)
		}
	}
}
