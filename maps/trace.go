package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// `kpr trace` sessions on the socket hooks (bpf/sock_lb.c, struct
// trace_key in bpf/types.h).
//
// Each trace owns one session: its own ring buffer, installed in
// kpr_trace_rings under a session number nobody else holds, and its own
// entries (frontend, session) in kpr_trace_frontends. Two traces never
// share or remove each other's entries, even for the same frontend, and
// each sees every event of its frontends. The single flag kpr_trace_on is
// the only shared state: it is set by every trace that starts, and
// cleared only by the last one to leave (see release).

// TraceEvent is one translation decision of a socket hook.
type TraceEvent struct {
	Time         time.Time `json:"time"`
	Hook         string    `json:"hook"`
	SocketCookie uint64    `json:"socketCookie"`
	NetNSCookie  uint64    `json:"netnsCookie"`
	// PID and Comm are the calling process, where the kernel gives the
	// hook the current task (0 and "" otherwise).
	PID      uint32         `json:"pid,omitempty"`
	Comm     string         `json:"comm,omitempty"`
	Proto    string         `json:"proto"` // "TCP" or "UDP"
	Frontend netip.AddrPort `json:"frontend"`
	// Backend is valid only when Verdict is "translated".
	Backend netip.AddrPort `json:"backend"`
	// Verdict is "translated", "rejected" (a frontend without endpoints)
	// or "passed" (no Service at that address for this socket).
	Verdict string `json:"verdict"`
}

// Trace is one running trace session.
type Trace struct {
	m       *bpf.KprMaps
	session uint32
	ring    *ebpf.Map
	reader  *ringbuf.Reader
	keys    []bpf.KprTraceKey
	// bootOffset turns the programs' CLOCK_MONOTONIC stamps into wall time.
	bootOffset time.Duration
}

// StartTrace claims a session and selects frontends for it: from now on
// the socket hooks write every decision about those addresses and ports
// (TCP and UDP) to this trace's ring buffer. Close ends it.
func StartTrace(m *bpf.KprMaps, frontends []netip.AddrPort) (*Trace, error) {
	if len(frontends) == 0 {
		return nil, errors.New("trace: no frontend selected")
	}
	clearDeadSessions(m)
	spec, err := bpf.LoadKpr()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	inner := spec.Maps[bpf.KprMapKprTraceRings].InnerMap
	if inner == nil {
		return nil, errors.New("the embedded BPF object has no trace ring buffer spec")
	}
	ring, err := ebpf.NewMap(inner.Copy())
	if err != nil {
		return nil, fmt.Errorf("create the trace ring buffer: %w", err)
	}
	// The map holds one entry per session the programs look at
	// (TRACE_MAX_SESSIONS in bpf/types.h).
	sessions := m.KprTraceRings.MaxEntries()
	t := &Trace{m: m, ring: ring, session: sessions}
	for s := uint32(0); s < sessions; s++ {
		err = m.KprTraceRings.Update(s, ring, ebpf.UpdateNoExist)
		if err == nil {
			t.session = s
			break
		}
		if !errors.Is(err, ebpf.ErrKeyExist) {
			ring.Close()
			return nil, fmt.Errorf("claim a trace session: %w (is the running kpr older than this one? restart it)", err)
		}
	}
	if t.session == sessions {
		ring.Close()
		return nil, fmt.Errorf("all %d trace sessions are taken: stop another kpr trace first", sessions)
	}
	pid := uint32(os.Getpid())
	for _, fe := range frontends {
		k := bpf.KprTraceKey{Addr: addrToBPF(fe.Addr()), Port: portToBPF(fe.Port()), Session: uint8(t.session)}
		if err := m.KprTraceFrontends.Update(k, pid, ebpf.UpdateAny); err != nil {
			t.Close()
			return nil, fmt.Errorf("select frontend %s for tracing: %w", fe, err)
		}
		t.keys = append(t.keys, k)
	}
	// After the session exists, so that a trace leaving at the same time
	// sees it (see release).
	if err := m.KprTraceOn.Put(uint32(0), uint32(1)); err != nil {
		t.Close()
		return nil, fmt.Errorf("switch tracing on: %w", err)
	}
	if t.reader, err = ringbuf.NewReader(ring); err != nil {
		t.Close()
		return nil, fmt.Errorf("read the trace ring buffer: %w", err)
	}
	mono, err := monotonicNow()
	if err != nil {
		t.Close()
		return nil, err
	}
	t.bootOffset = time.Duration(time.Now().UnixNano() - int64(mono))
	return t, nil
}

// Session is the number this trace holds in kpr_trace_rings.
func (t *Trace) Session() uint32 { return t.session }

// Read blocks until the next event. After Close it returns an error
// matching os.ErrClosed.
func (t *Trace) Read() (TraceEvent, error) {
	rec, err := t.reader.Read()
	if err != nil {
		return TraceEvent{}, err
	}
	var ev bpf.KprTraceEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
		return TraceEvent{}, fmt.Errorf("decode a trace record of %d bytes: %w", len(rec.RawSample), err)
	}
	out := TraceEvent{
		Time:         time.Unix(0, int64(ev.TimeNs)+int64(t.bootOffset)),
		Hook:         hookName(ev.Hook),
		SocketCookie: ev.SocketCookie,
		NetNSCookie:  ev.NetnsCookie,
		PID:          ev.Pid,
		Comm:         unix.ByteSliceToString(ev.Comm[:]),
		Proto:        dataplane.Protocol(ev.Proto).String(),
		Frontend:     netip.AddrPortFrom(addrFromBPF(ev.FrontendAddr), portFromBPF(ev.FrontendPort)),
		Verdict:      verdictName(ev.Verdict),
	}
	if ev.Verdict == bpf.KprSockVerdictSOCK_VERDICT_TRANSLATED {
		out.Backend = netip.AddrPortFrom(addrFromBPF(ev.BackendAddr), portFromBPF(ev.BackendPort))
	}
	return out, nil
}

// Close removes this trace's selection and session, and switches tracing
// off if no other trace runs. A blocked Read returns.
func (t *Trace) Close() error {
	var errs []error
	if t.reader != nil {
		errs = append(errs, t.reader.Close())
	}
	for _, k := range t.keys {
		if err := t.m.KprTraceFrontends.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove a traced frontend: %w", err))
		}
	}
	if t.session < t.m.KprTraceRings.MaxEntries() {
		errs = append(errs, release(t.m, t.session))
	}
	errs = append(errs, t.ring.Close())
	return errors.Join(errs...)
}

// release gives up session and clears kpr_trace_on if it was the last.
// A trace starting meanwhile claims its session before it sets the flag:
// if the claim comes before the second look here, that look sets the
// flag back; if after, the starting trace's own set comes after this
// clear. Either way the flag ends up set while a session exists.
func release(m *bpf.KprMaps, session uint32) error {
	if err := m.KprTraceRings.Delete(session); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("release trace session %d: %w", session, err)
	}
	if anySession(m) {
		return nil
	}
	if err := m.KprTraceOn.Put(uint32(0), uint32(0)); err != nil {
		return fmt.Errorf("switch tracing off: %w", err)
	}
	if anySession(m) {
		return m.KprTraceOn.Put(uint32(0), uint32(1))
	}
	return nil
}

func anySession(m *bpf.KprMaps) bool {
	var s uint32
	err := m.KprTraceRings.NextKey(nil, &s)
	// On an error other than "empty", keep tracing on: a flag left set
	// costs a lookup per connect, a flag wrongly cleared loses events.
	return !errors.Is(err, ebpf.ErrKeyNotExist)
}

// clearDeadSessions removes what traces killed before their Close left
// behind: frontend entries whose pid is gone, and their sessions. A pid is
// looked up in this process's pid namespace, where kpr trace runs.
func clearDeadSessions(m *bpf.KprMaps) {
	var k bpf.KprTraceKey
	var pid uint32
	var stale []bpf.KprTraceKey
	dead := map[uint32]bool{}
	it := m.KprTraceFrontends.Iterate()
	for it.Next(&k, &pid) {
		if err := syscall.Kill(int(pid), 0); errors.Is(err, syscall.ESRCH) {
			stale = append(stale, k)
			dead[uint32(k.Session)] = true
		}
	}
	for _, k := range stale {
		_ = m.KprTraceFrontends.Delete(k)
	}
	for s := range dead {
		_ = release(m, s)
	}
}
