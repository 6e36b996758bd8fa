package loader

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Devices are named as the given network namespace names them: loopback
// is ifindex 1 in every namespace.
func TestDeviceNameOfLoopback(t *testing.T) {
	if got := DeviceName("", 1); got != "lo" {
		t.Errorf("DeviceName(1) = %q, want lo", got)
	}
	if got := DeviceName("", 1<<30); got != "" {
		t.Errorf("DeviceName of a missing ifindex = %q, want empty", got)
	}
}

// A pin that is no link is listed with the error, not skipped: status
// shows what is wrong under --bpf-root.
func TestPinnedLinksReportsWhatCannotBeRead(t *testing.T) {
	root := t.TempDir()
	if got := PinnedLinks(root, ""); len(got) != 0 {
		t.Errorf("PinnedLinks without a links directory = %+v, want none", got)
	}
	if err := os.MkdirAll(linkDir(root), 0o700); err != nil {
		t.Fatal(err)
	}
	bogus := filepath.Join(linkDir(root), "kpr_connect4")
	if err := os.WriteFile(bogus, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := PinnedLinks(root, "")
	if len(got) != 1 || got[0].Pin != bogus || got[0].Error == "" {
		t.Errorf("PinnedLinks = %+v, want the one pin with its error", got)
	}
}

// Cleanup takes away the hooks that translate requests (and the tc
// links) before those that translate replies back, so that the reply to a
// datagram sent just before still comes from the Service's address (a
// rollback to kube-proxy lost one such reply in tests/migration when
// recvmsg went first, as its pin sorts before sendmsg's).
func TestCleanupDetachesReplyHooksLast(t *testing.T) {
	dir := "/sys/fs/bpf/kpr/links/"
	pins := []string{dir + "kpr_connect4", dir + "kpr_getpeer4", dir + "kpr_recvmsg4", dir + "kpr_recvmsg6",
		dir + "kpr_sendmsg4", dir + "kpr_sendmsg6", dir + "kpr_sock_release", dir + "tc-ingress-eth0"}
	forward, reverse := splitReverseHooks(pins)
	wantForward := []string{dir + "kpr_connect4", dir + "kpr_sendmsg4", dir + "kpr_sendmsg6", dir + "tc-ingress-eth0"}
	wantReverse := []string{dir + "kpr_getpeer4", dir + "kpr_recvmsg4", dir + "kpr_recvmsg6", dir + "kpr_sock_release"}
	if !slices.Equal(forward, wantForward) || !slices.Equal(reverse, wantReverse) {
		t.Errorf("detach order %v then %v, want %v then %v", forward, reverse, wantForward, wantReverse)
	}
}
