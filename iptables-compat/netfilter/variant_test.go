package netfilter

import (
	"errors"
	"strings"
	"testing"
)

// scripted answers each command with its output, and fails those that are
// not installed.
type scripted struct {
	out     map[string]string
	missing map[string]bool
}

func (s scripted) Run(name string, args []string, _ []byte) ([]byte, error) {
	if s.missing[name] {
		return nil, errors.New(name + ": executable file not found in $PATH")
	}
	return []byte(s.out[strings.TrimSpace(name+" "+strings.Join(args, " "))]), nil
}

func TestDetectVariant(t *testing.T) {
	const rule = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"
	nfTables := map[string]string{"iptables --version": "iptables v1.8.9 (nf_tables)"}
	for _, tc := range []struct {
		name    string
		r       scripted
		want    Variant
		wantErr bool
	}{
		{"rules only in legacy", scripted{out: map[string]string{"iptables-legacy-save": rule}}, Legacy, false},
		{"rules only in nft", scripted{out: map[string]string{"iptables-nft-save": rule}}, NFT, false},
		{"nothing anywhere, iptables says legacy", scripted{out: map[string]string{"iptables --version": "iptables v1.8.7 (legacy)"}}, Legacy, false},
		{"nothing anywhere, iptables says nf_tables", scripted{out: nfTables}, NFT, false},
		{"no legacy binary", scripted{out: nfTables, missing: map[string]bool{"iptables-legacy-save": true}}, NFT, false},
		{"no nft binary", scripted{out: nfTables, missing: map[string]bool{"iptables-nft-save": true}}, Legacy, false},
		{"no binary", scripted{missing: map[string]bool{"iptables-nft-save": true, "iptables-legacy-save": true}}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := DetectVariant(tc.r)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "install") {
					t.Fatalf("DetectVariant = %s, %v; want an error saying what to install", got, err)
				}
				return
			}
			if err != nil || got != tc.want || why == "" {
				t.Fatalf("DetectVariant = %s (%q), %v; want %s with a reason", got, why, err, tc.want)
			}
		})
	}
}
