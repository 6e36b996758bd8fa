package loader

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// Without the host namespace's cookie (no SO_NETNS_COOKIE before Linux
// 5.14) the hooks cannot tell sockets apart by namespace: host-only is
// refused, per-pod serves every socket and says so, all is unaffected.
func TestEffectiveSocketLBWithoutNetNSCookies(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	log := zap.New(core)
	if m, err := effectiveSocketLB(SocketLBHostOnly, 0, log); err == nil || !strings.Contains(err.Error(), "SO_NETNS_COOKIE") {
		t.Errorf("host-only without a cookie = %v, %v; want an error naming SO_NETNS_COOKIE", m, err)
	}
	if m, err := effectiveSocketLB(SocketLBPerPod, 0, log); err != nil || m != SocketLBAll || logs.Len() != 1 {
		t.Errorf("per-pod without a cookie = %v, %v (%d warnings); want all and one warning", m, err, logs.Len())
	}
	for _, want := range []SocketLBMode{SocketLBAll, SocketLBHostOnly, SocketLBPerPod} {
		if m, err := effectiveSocketLB(want, 42, log); err != nil || m != want {
			t.Errorf("%v with a cookie = %v, %v; want it as asked", want, m, err)
		}
	}
}
