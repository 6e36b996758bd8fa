package maps

import (
	"testing"

	"github.com/kpr-io/kpr/bpf"
)

// Every hook and verdict the C enums have gets a name: a new one without
// a row would be exported as "hookN".
func TestSockEnumsHaveNames(t *testing.T) {
	if len(sockHookNames) != int(bpf.KprSockHookSOCK_HOOK_COUNT) {
		t.Errorf("%d hook names for %d hooks in enum sock_hook", len(sockHookNames), bpf.KprSockHookSOCK_HOOK_COUNT)
	}
	if len(sockVerdictNames) != int(bpf.KprSockVerdictSOCK_VERDICT_COUNT) {
		t.Errorf("%d verdict names for %d verdicts in enum sock_verdict", len(sockVerdictNames), bpf.KprSockVerdictSOCK_VERDICT_COUNT)
	}
	for i, n := range sockHookNames {
		if n == "" {
			t.Errorf("hook %d has no name", i)
		}
	}
	for i, n := range sockVerdictNames {
		if n == "" {
			t.Errorf("verdict %d has no name", i)
		}
	}
}
