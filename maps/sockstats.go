package maps

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
)

// Reading the socket hooks' counters (kpr_sock_stats): one struct
// sock_stats per hook and CPU, indexed as bpf/types.h's enum sock_hook and
// enum sock_verdict say. Only the programs write them.

// The names of the hooks and verdicts, as metric labels and in `kpr
// status` and `kpr trace`. Indexed by the C enums: a hook or verdict the C
// side gains without a name here fails sockstats_test.go.
var (
	sockHookNames = [...]string{
		bpf.KprSockHookSOCK_HOOK_CONNECT4:     "connect4",
		bpf.KprSockHookSOCK_HOOK_CONNECT6:     "connect6",
		bpf.KprSockHookSOCK_HOOK_SENDMSG4:     "sendmsg4",
		bpf.KprSockHookSOCK_HOOK_SENDMSG6:     "sendmsg6",
		bpf.KprSockHookSOCK_HOOK_RECVMSG4:     "recvmsg4",
		bpf.KprSockHookSOCK_HOOK_RECVMSG6:     "recvmsg6",
		bpf.KprSockHookSOCK_HOOK_GETPEERNAME4: "getpeername4",
		bpf.KprSockHookSOCK_HOOK_GETPEERNAME6: "getpeername6",
	}
	sockVerdictNames = [...]string{
		bpf.KprSockVerdictSOCK_VERDICT_PASSED:     "passed",
		bpf.KprSockVerdictSOCK_VERDICT_TRANSLATED: "translated",
		bpf.KprSockVerdictSOCK_VERDICT_REJECTED:   "rejected",
		bpf.KprSockVerdictSOCK_VERDICT_BYPASSED:   "bypassed",
	}
)

func hookName(h bpf.KprSockHook) string {
	if int(h) < len(sockHookNames) {
		return sockHookNames[h]
	}
	return fmt.Sprintf("hook%d", h)
}

func verdictName(v bpf.KprSockVerdict) string {
	if int(v) < len(sockVerdictNames) {
		return sockVerdictNames[v]
	}
	return fmt.Sprintf("verdict%d", v)
}

// SockHookStats is what one socket hook decided since the map was created,
// summed over CPUs. For connect and sendmsg, Translated counts frontends
// rewritten to a backend, Rejected frontends without endpoints (the
// syscall fails), Passed addresses that are no frontend. For recvmsg and
// getpeername, Translated counts backends rewritten back to the frontend
// and Passed addresses with no reverse entry; they never reject. Bypassed
// counts frontends of connect and sendmsg left untranslated because the
// socket's pod is not served by the socket hooks (--socket-lb).
type SockHookStats struct {
	Hook       string `json:"hook"`
	Translated uint64 `json:"translated"`
	Rejected   uint64 `json:"rejected"`
	Passed     uint64 `json:"passed"`
	Bypassed   uint64 `json:"bypassed"`
}

// SockStats reads m, a kpr_sock_stats map, one entry per hook in enum
// order.
func SockStats(m *ebpf.Map) ([]SockHookStats, error) {
	out := make([]SockHookStats, 0, bpf.KprSockHookSOCK_HOOK_COUNT)
	var per []bpf.KprSockStats
	for h := bpf.KprSockHook(0); h < bpf.KprSockHookSOCK_HOOK_COUNT && uint32(h) < m.MaxEntries(); h++ {
		if err := m.Lookup(uint32(h), &per); err != nil {
			return nil, fmt.Errorf("read socket hook counters (%s): %w", hookName(h), err)
		}
		var sum [bpf.KprSockVerdictSOCK_VERDICT_COUNT]uint64
		for _, s := range per {
			for v := range sum {
				sum[v] += s.Count[v]
			}
		}
		out = append(out, SockHookStats{
			Hook:       hookName(h),
			Translated: sum[bpf.KprSockVerdictSOCK_VERDICT_TRANSLATED],
			Rejected:   sum[bpf.KprSockVerdictSOCK_VERDICT_REJECTED],
			Passed:     sum[bpf.KprSockVerdictSOCK_VERDICT_PASSED],
			Bypassed:   sum[bpf.KprSockVerdictSOCK_VERDICT_BYPASSED],
		})
	}
	return out, nil
}
