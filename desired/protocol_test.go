package desired

import (
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
)

func TestParseProtocol(t *testing.T) {
	for _, c := range []struct {
		in   string
		want dataplane.Protocol
	}{
		{"TCP", dataplane.TCP}, {"tcp", dataplane.TCP}, {"", dataplane.TCP},
		{"UDP", dataplane.UDP}, {"udp", dataplane.UDP},
		{"SCTP", dataplane.SCTP}, {"sctp", dataplane.SCTP},
	} {
		if got, err := parseProtocol(c.in); err != nil || got != c.want {
			t.Errorf("parseProtocol(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"QUIC", "Tcp", " TCP", "6"} {
		if got, err := parseProtocol(in); err == nil || !strings.Contains(err.Error(), "unknown protocol") {
			t.Errorf("parseProtocol(%q) = %v, %v; want an unknown-protocol error", in, got, err)
		}
	}
}
