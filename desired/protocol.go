package desired

import (
	"fmt"

	"github.com/kpr-io/kpr/dataplane"
)

// parseProtocol reads the protocol of a Service port or EndpointSlice port.
// The empty string is TCP, the default the API server fills in, so objects
// that skipped defaulting read the same. The API server stores only the
// upper-case names; the lower-case ones are accepted as well. An unknown
// name is an error, which callers report as a Problem.
func parseProtocol(s string) (dataplane.Protocol, error) {
	switch s {
	case "TCP", "tcp", "":
		return dataplane.TCP, nil
	case "UDP", "udp":
		return dataplane.UDP, nil
	case "SCTP", "sctp":
		return dataplane.SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q: want TCP, UDP or SCTP", s)
}
