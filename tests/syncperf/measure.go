package syncperf

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kpr-io/kpr/tests/kprproc"
)

// Messages of kpr's log (watcher/) that mark the start-up phases.
const (
	msgWatching     = "Waiting for the Service, EndpointSlice and Node caches to sync"
	msgCachesSynced = "Caches synced; starting the dataplane sync loop"
	msgFirstSync    = "First full sync of the dataplane done"
)

// LogArgs are the `kpr run` flags the measurements need: JSON logs carry
// timestamps with sub-microsecond resolution (the text format has ms).
var LogArgs = []string{"--log-format", "json"}

// Startup is one start of `kpr run`, all times measured from just before
// the process was started.
type Startup struct {
	// Watching: kpr has loaded its BPF programs and started its informers.
	Watching time.Duration
	// CachesSynced: kpr logged that its informer caches hold the whole API.
	CachesSynced time.Duration
	// Programmed: every Service was seen in the pinned maps with all its
	// backends.
	Programmed time.Duration
	// FirstSyncLogged: kpr logged the end of its first full reconcile.
	FirstSyncLogged time.Duration
	// FirstSyncTook is that reconcile's own duration, as kpr logged it.
	FirstSyncTook time.Duration
	// Proc is kpr's CPU time and peak memory when Programmed was seen.
	Proc ProcStats
	// SyncCPU is the CPU time kpr used from CachesSynced to Programmed
	// (to within the 10 ms tick of the kernel's accounting and one poll).
	// Far less than the wall time means kpr was waiting for a CPU.
	SyncCPU time.Duration
}

// SyncedToProgrammed is the start-up target of issue 3: from the caches
// being synced to every Service in the maps.
func (s Startup) SyncedToProgrammed() time.Duration { return s.Programmed - s.CachesSynced }

func (s Startup) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("start->watching %v, ->caches synced %v, caches synced->all programmed %v "+
		"(kpr on CPU %v of it; first full sync logged at +%v, reconcile took %v), "+
		"start->all programmed %v, kpr CPU %v, peak RSS %.1f MiB (file-backed now %.1f MiB)",
		r(s.Watching), r(s.CachesSynced), r(s.SyncedToProgrammed()), s.SyncCPU, r(s.FirstSyncLogged-s.CachesSynced),
		r(s.FirstSyncTook), r(s.Programmed), s.Proc.CPU, float64(s.Proc.PeakRSS)/(1<<20), float64(s.Proc.RSSFile)/(1<<20))
}

// programmedPoll is how often the start-up measurement looks at the maps.
// A poll that finds the next Service missing costs one lookup, so polling
// this often does not take CPU from kpr.
const programmedPoll = 5 * time.Millisecond

// MeasureStartup follows a `kpr run` started (with LogArgs) at started
// until every Service in svcs is programmed, and returns the phases of the
// start-up and a MapReader on its maps (the caller closes it).
func MeasureStartup(ctx context.Context, p *kprproc.Process, started time.Time, svcs []*Service) (Startup, *MapReader, error) {
	var st Startup
	// kpr's CPU time along the way, to tell how much of the sync phase it
	// spent computing rather than waiting for a CPU.
	var cpu cpuTrace
	reader, err := openWhenPinned(ctx, p, &cpu)
	if err != nil {
		return st, nil, err
	}
	// Services are checked in order and each is checked once it is
	// complete: kpr writes a master entry after its slots and backends and
	// never removes it during start-up, so a complete Service stays so.
	done := 0
	for done < len(svcs) {
		s := svcs[done]
		n, ok, err := reader.BackendCount(s.ClusterIP, ServicePort)
		if err != nil {
			reader.Close()
			return st, nil, err
		}
		if ok && n == len(s.Endpoints) {
			done++
			continue
		}
		cpu.sample(p.PID())
		if err := pause(ctx, p, programmedPoll); err != nil {
			reader.Close()
			return st, nil, fmt.Errorf("waiting for Service %d of %d to be programmed: %w", done+1, len(svcs), err)
		}
	}
	st.Programmed = time.Since(started)
	if st.Proc, err = ReadProcStats(p.PID()); err != nil {
		reader.Close()
		return st, nil, err
	}
	if err := st.readLog(ctx, p, started); err != nil {
		reader.Close()
		return st, nil, err
	}
	st.SyncCPU = st.Proc.CPU - cpu.at(started.Add(st.CachesSynced))
	return st, reader, nil
}

// cpuTrace is a series of CPU time readings of a process.
type cpuTrace struct {
	when []time.Time
	cpu  []time.Duration
}

// sample records the process's CPU time now; a failed read is skipped (the
// caller notices an exited process on its own).
func (c *cpuTrace) sample(pid int) {
	if d, err := readCPU(pid); err == nil {
		c.when = append(c.when, time.Now())
		c.cpu = append(c.cpu, d)
	}
}

// at returns the last reading taken at or before t (zero if none).
func (c *cpuTrace) at(t time.Time) time.Duration {
	var d time.Duration
	for i, w := range c.when {
		if w.After(t) {
			break
		}
		d = c.cpu[i]
	}
	return d
}

// openWhenPinned opens kpr's maps as soon as it has pinned them.
func openWhenPinned(ctx context.Context, p *kprproc.Process, cpu *cpuTrace) (*MapReader, error) {
	for {
		r, openErr := OpenMapReader(p.BPFRoot)
		if openErr == nil {
			return r, nil
		}
		cpu.sample(p.PID())
		if err := pause(ctx, p, programmedPoll); err != nil {
			return nil, fmt.Errorf("waiting for kpr to pin its maps: %w (last attempt: %v)", err, openErr)
		}
	}
}

// pause sleeps d unless ctx ends or kpr exits first.
func pause(ctx context.Context, p *kprproc.Process, d time.Duration) error {
	if p.Exited() {
		return fmt.Errorf("kpr exited; its log ends:\n%s", tail(p.Log(), 20))
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w; kpr's log ends:\n%s", ctx.Err(), tail(p.Log(), 20))
	case <-time.After(d):
		return nil
	}
}

// readLog fills in the phases kpr logs. The first-sync line is written
// just after the maps are, so it may lag what MeasureStartup saw.
func (st *Startup) readLog(ctx context.Context, p *kprproc.Process, started time.Time) error {
	for {
		lines := parseLog(p.Log())
		watching, okWatching := lines[msgWatching]
		synced, okSynced := lines[msgCachesSynced]
		first, okFirst := lines[msgFirstSync]
		if okWatching && okSynced && okFirst {
			st.Watching = watching.At.Sub(started)
			st.CachesSynced = synced.At.Sub(started)
			st.FirstSyncLogged = first.At.Sub(started)
			took, ok := first.duration("took")
			if !ok {
				return fmt.Errorf("kpr's %q line has no took duration: %v", msgFirstSync, first.Fields)
			}
			st.FirstSyncTook = took
			return nil
		}
		if err := pause(ctx, p, 20*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for kpr to log %q, %q and %q: %w", msgWatching, msgCachesSynced, msgFirstSync, err)
		}
	}
}

// msgSynced is kpr's debug-level line after every successful sync.
const msgSynced = "Synced the dataplane"

// FullSyncDurations returns how long each full reconcile took, in log
// order, as kpr logs them at --log-level=debug.
func FullSyncDurations(log string) []time.Duration {
	var out []time.Duration
	for _, line := range parseLogLines(log) {
		full, _ := line.Fields["full"].(bool)
		took, ok := line.duration("took")
		if line.Fields["msg"] == msgSynced && full && ok {
			out = append(out, took)
		}
	}
	return out
}

// msgPassDone is kpr's debug-level line after a periodic full reconcile
// that ran in steps between other syncs.
const msgPassDone = "Periodic full reconcile done in steps"

// LongestReconcileSteps returns, per periodic full reconcile that ran in
// steps, its longest step: the longest an update arriving during it can
// wait for the sync loop. Empty for a kpr that reconciles in one piece.
func LongestReconcileSteps(log string) []time.Duration {
	var out []time.Duration
	for _, line := range parseLogLines(log) {
		longest, ok := line.duration("longestStep")
		if line.Fields["msg"] == msgPassDone && ok {
			out = append(out, longest)
		}
	}
	return out
}

// logLine is one JSON log line of kpr.
type logLine struct {
	At     time.Time
	Fields map[string]any
}

// duration reads a duration field, which the JSON log writes as Go
// prints durations ("1.5ms").
func (l logLine) duration(key string) (time.Duration, bool) {
	s, _ := l.Fields[key].(string)
	d, err := time.ParseDuration(s)
	return d, err == nil
}

// parseLog returns the first line of each message in a JSON log.
func parseLog(text string) map[string]logLine {
	out := map[string]logLine{}
	for _, line := range parseLogLines(text) {
		msg := line.Fields["msg"].(string)
		if _, seen := out[msg]; !seen {
			out[msg] = line
		}
	}
	return out
}

// parseLogLines returns the lines of a JSON log that have a message and a
// timestamp; lines that are not JSON (a panic, say) are skipped.
func parseLogLines(text string) []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var fields map[string]any
		if json.Unmarshal(sc.Bytes(), &fields) != nil {
			continue
		}
		msg, _ := fields["msg"].(string)
		ts, ok := fields["ts"].(float64) // Kubernetes components' JSON: milliseconds since the epoch
		if msg == "" || !ok {
			continue
		}
		ms, frac := math.Modf(ts)
		out = append(out, logLine{At: time.UnixMilli(int64(ms)).Add(time.Duration(frac * float64(time.Millisecond))), Fields: fields})
	}
	return out
}

// Update is one timed EndpointSlice update.
type Update struct {
	// FromSend runs from just before the UPDATE request was sent to the
	// maps holding the new backends; FromReturn from the moment the API
	// server's answer arrived. APICall is the request itself.
	FromSend, FromReturn, APICall time.Duration
}

// updatePoll is the pause between two reads of the updated Service. One
// read is 21 map lookups (about 30 µs); a pause keeps the poller from
// taking a whole core from kpr on a small machine, at a resolution far
// below the 50 ms target.
const updatePoll = 200 * time.Microsecond

// MeasureUpdate replaces endpoint j of s with addr through the API and
// waits until the maps hold s's new backends, at most timeout.
func MeasureUpdate(ctx context.Context, client kubernetes.Interface, reader *MapReader, p *kprproc.Process,
	s *Service, j int, addr netip.Addr, timeout time.Duration) (Update, error) {
	sent := time.Now()
	if err := ReplaceEndpoint(ctx, client, s, j, addr); err != nil {
		return Update{}, err
	}
	returned := time.Now()
	want := s.Backends()
	deadline := returned.Add(timeout)
	for {
		got, err := reader.Backends(s.ClusterIP, ServicePort)
		if err != nil {
			return Update{}, err
		}
		if slices.Equal(got, want) {
			seen := time.Now()
			return Update{FromSend: seen.Sub(sent), FromReturn: seen.Sub(returned), APICall: returned.Sub(sent)}, nil
		}
		if time.Now().After(deadline) {
			return Update{}, fmt.Errorf("service %d (%s): the maps still hold %v, not %v, %v after the update",
				s.Index, s.ClusterIP, got, want, timeout)
		}
		if err := pause(ctx, p, updatePoll); err != nil {
			return Update{}, err
		}
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}
