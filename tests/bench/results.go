package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Results is the machine-readable outcome of one benchmark run
// (docs/bench/results.json).
type Results struct {
	Schema    int       `json:"schema"`
	StartedAt time.Time `json:"startedAt"`
	// TotalSeconds is the whole run, setup included.
	TotalSeconds float64           `json:"totalSeconds"`
	Command      string            `json:"command"`
	Machine      Machine           `json:"machine"`
	Versions     map[string]string `json:"versions"`
	Settings     Settings          `json:"settings"`
	// Populate holds how long creating the Services took, per size.
	Populate []Populate `json:"populate"`
	Runs     []Run      `json:"runs"`
	Targets  []Target   `json:"targets"`
	// HostUnchanged is the host firewall check: true when the host's
	// rules and conntrack settings were the same before and after.
	HostUnchanged bool `json:"hostUnchanged"`
}

const resultsSchema = 1

// Machine describes where the run happened.
type Machine struct {
	CPU      string `json:"cpu"`
	Cores    int    `json:"cores"`
	MemoryGB int    `json:"memoryGB"`
	Kernel   string `json:"kernel"`
}

// Settings are the run's parameters.
type Settings struct {
	Sizes               []int    `json:"sizes"`
	EndpointsPerService int      `json:"endpointsPerService"`
	Updates             int      `json:"updates"`
	Samples             int      `json:"samples"`
	Proxies             []string `json:"proxies"`
	MinSyncPeriod       string   `json:"minSyncPeriod"`
	// KubeProxyMinSyncPeriod is what kube-proxy got: it cannot express 0.
	KubeProxyMinSyncPeriod string `json:"kubeProxyMinSyncPeriod"`
	// NotBuilt lists proxies the issues name that the harness does not
	// run, each with why (the name stays for older results files).
	NotBuilt []string `json:"notBuilt"`
}

// Populate is the time to create Services up to a size.
type Populate struct {
	Services int     `json:"services"`
	Seconds  float64 `json:"seconds"`
}

// Run is one proxy at one Service count, in a fresh node namespace.
type Run struct {
	Proxy               string `json:"proxy"`
	Services            int    `json:"services"`
	EndpointsPerService int    `json:"endpointsPerService"`
	// Skipped says why the run was not made (e.g. the proxy did not
	// converge at a smaller size); empty when it ran.
	Skipped   string    `json:"skipped"`
	ColdStart ColdStart `json:"coldStart"`
	// ConnLatency and Programming are null when the cold start did not
	// converge (nothing to measure against).
	ConnLatency *ConnLatency `json:"connLatency"`
	Programming *Programming `json:"programming"`
	// BPFMapBytes is the kernel memory of kpr's maps after the cold start;
	// null for proxies without BPF maps.
	BPFMapBytes *int64 `json:"bpfMapBytes"`
	// PeakRSSBytes is the largest peak RSS of any phase.
	PeakRSSBytes int64 `json:"peakRSSBytes"`
}

// ColdStart: from the proxy's start until the last-created Service answers
// and every other Service has answered once.
type ColdStart struct {
	Converged      bool    `json:"converged"`
	Seconds        float64 `json:"seconds"`
	TimeoutSeconds float64 `json:"timeoutSeconds"`
	// LastServiceSeconds is when the last-created Service first answered;
	// Seconds is later if some other Service answered only after it.
	LastServiceSeconds float64 `json:"lastServiceSeconds"`
	// ServicesVerified is how many Services answered a connection.
	ServicesVerified int `json:"servicesVerified"`
	// LateServices answered only on a retry after the last-created one.
	LateServices int       `json:"lateServices"`
	Resources    Resources `json:"resources"`
	// Note explains a failure to converge.
	Note string `json:"note"`
}

// ConnLatency: TCP connect plus a 1-byte echo, in microseconds, measured
// round-robin against the first- and last-created ClusterIP and a backend
// pod directly.
type ConnLatency struct {
	Samples int `json:"samples"`
	// Failures counts connections that were not answered within 2s
	// (at most 1% are tolerated); they enter the series at 2s.
	Failures int         `json:"failures"`
	First    Percentiles `json:"first"`
	Last     Percentiles `json:"last"`
	Direct   Percentiles `json:"direct"`
	// Ratios of the last-created ClusterIP over direct (the number the
	// targets use) and of the first-created one.
	LastRatioP50  float64   `json:"lastRatioP50"`
	LastRatioP99  float64   `json:"lastRatioP99"`
	FirstRatioP50 float64   `json:"firstRatioP50"`
	FirstRatioP99 float64   `json:"firstRatioP99"`
	Resources     Resources `json:"resources"`
}

// Percentiles in microseconds.
type Percentiles struct {
	P50 float64 `json:"p50Us"`
	P99 float64 `json:"p99Us"`
}

// Programming: EndpointSlice updates from the API write until a client in
// the node namespace reaches the new backends, in milliseconds.
type Programming struct {
	Updates   int       `json:"updates"`
	TimedOut  int       `json:"timedOut"`
	P50       float64   `json:"p50Ms"`
	P90       float64   `json:"p90Ms"`
	P99       float64   `json:"p99Ms"`
	Max       float64   `json:"maxMs"`
	Latencies []float64 `json:"latenciesMs"`
	// WriteP50 is the API write's own round trip, part of every latency.
	WriteP50  float64   `json:"writeP50Ms"`
	Resources Resources `json:"resources"`
}

// Resources is a proxy process's cost during one phase.
type Resources struct {
	WallSeconds float64 `json:"wallSeconds"`
	CPUSeconds  float64 `json:"cpuSeconds"`
	// ChildrenCPUSeconds: finished children it waited for (iptables-restore, nft).
	ChildrenCPUSeconds float64 `json:"childrenCpuSeconds"`
	PeakRSSBytes       int64   `json:"peakRSSBytes"`
	RSSBytes           int64   `json:"rssBytes"`
}

// Target is one of the goals for kpr, judged on this run.
type Target struct {
	Name string `json:"name"`
	// Want is the goal, e.g. ">= 20".
	Want string `json:"want"`
	// Services is the size it was judged at (the largest measured).
	Services int `json:"services"`
	// Value is the measured ratio; Met whether it reaches Want.
	Value     float64 `json:"value"`
	Met       bool    `json:"met"`
	Evaluated bool    `json:"evaluated"`
	Detail    string  `json:"detail"`
}

// percentile returns the p-th percentile (0-100) of xs by nearest rank, 0
// for no values (JSON has no NaN).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

func micros(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d.Nanoseconds()) / 1e3
	}
	return out
}

func percentilesOf(ds []time.Duration) Percentiles {
	us := micros(ds)
	return Percentiles{P50: percentile(us, 50), P99: percentile(us, 99)}
}

// WriteJSON writes r to path.
func (r *Results) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ValidateJSON reads a results file back and checks that it holds every
// field of the schema at every level (a field added to the structs but
// lost on the way shows up here), and that the numbers of every converged
// run are real measurements, not zero values.
func ValidateJSON(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("%s is not JSON: %w", path, err)
	}
	var problems []string
	checkFields(reflect.TypeOf(Results{}), raw, "", &problems)
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return err
	}
	if len(r.Runs) == 0 {
		problems = append(problems, "no runs")
	}
	for _, run := range r.Runs {
		problems = append(problems, run.problems()...)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: %s", path, strings.Join(problems, "; "))
	}
	return nil
}

// checkFields walks the struct type t and the decoded JSON v together.
func checkFields(t reflect.Type, v any, path string, problems *[]string) {
	switch t.Kind() {
	case reflect.Pointer:
		if v != nil {
			checkFields(t.Elem(), v, path, problems)
		}
	case reflect.Slice:
		items, _ := v.([]any)
		for i, item := range items {
			checkFields(t.Elem(), item, fmt.Sprintf("%s[%d]", path, i), problems)
		}
	case reflect.Struct:
		if t == reflect.TypeOf(time.Time{}) {
			return
		}
		obj, ok := v.(map[string]any)
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s is not an object", path))
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			val, present := obj[name]
			if !present {
				*problems = append(*problems, fmt.Sprintf("field %s.%s missing", path, name))
				continue
			}
			checkFields(f.Type, val, path+"."+name, problems)
		}
	}
}

// problems lists what is implausible about a run's numbers.
func (run Run) problems() []string {
	var p []string
	where := fmt.Sprintf("%s at %d Services", run.Proxy, run.Services)
	bad := func(format string, args ...any) { p = append(p, where+": "+fmt.Sprintf(format, args...)) }
	if run.Skipped != "" {
		return nil
	}
	cs := run.ColdStart
	if cs.Resources.PeakRSSBytes <= 0 || cs.Resources.WallSeconds <= 0 {
		bad("cold start has no resource reading")
	}
	if !cs.Converged {
		if cs.Note == "" {
			bad("did not converge and says nothing about it")
		}
		return p
	}
	if cs.Seconds <= 0 || cs.ServicesVerified != run.Services {
		bad("cold start %.3fs with %d of %d Services verified", cs.Seconds, cs.ServicesVerified, run.Services)
	}
	if c := run.ConnLatency; c == nil {
		bad("no connection latency")
	} else if c.Samples <= 0 || !(c.Direct.P50 > 0) || !(c.Last.P50 > 0) || !(c.First.P99 > 0) || !(c.LastRatioP50 > 0) {
		bad("connection latency has empty numbers: %+v", *c)
	}
	if g := run.Programming; g == nil {
		bad("no programming latency")
	} else if g.Updates <= 0 || len(g.Latencies) != g.Updates-g.TimedOut || (g.TimedOut < g.Updates && !(g.P50 > 0 && g.P99 >= g.P50)) {
		bad("programming latency has inconsistent numbers: updates %d, timed out %d, %d latencies, p50 %v p99 %v", g.Updates, g.TimedOut, len(g.Latencies), g.P50, g.P99)
	}
	if run.Proxy == ProxyKPR && (run.BPFMapBytes == nil || *run.BPFMapBytes <= 0) {
		bad("no BPF map memory")
	}
	if run.PeakRSSBytes <= 0 {
		bad("no peak RSS")
	}
	return p
}
