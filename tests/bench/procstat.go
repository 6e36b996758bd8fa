package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/PID/stat. It is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procSample is one reading of a proxy process's cost.
type procSample struct {
	// CPU is the process's own user+system time; Children is the time of
	// the children it has waited for (kube-proxy's iptables-restore and
	// nft runs), which the proxy's work includes.
	CPU, Children time.Duration
	// HWM is the peak resident set size (VmHWM) since start or the last
	// resetPeak, RSS the current one, both in bytes.
	HWM, RSS int64
}

// readProc reads /proc/PID/stat and /proc/PID/status.
func readProc(pid int) (procSample, error) {
	var s procSample
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read CPU times of pid %d: %w", pid, err)
	}
	// The command name (field 2) may contain spaces and parentheses; the
	// fields after it start behind the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	// After ')': state(3) ... utime(14) stime(15) cutime(16) cstime(17),
	// so utime is f[11].
	if len(f) < 15 {
		return s, fmt.Errorf("/proc/%d/stat: only %d fields after the command", pid, len(f))
	}
	var ticks [4]int64
	for k := range ticks {
		if ticks[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return s, fmt.Errorf("/proc/%d/stat field %d: %w", pid, 14+k, err)
		}
	}
	tick := time.Second / clockTicks
	s.CPU = time.Duration(ticks[0]+ticks[1]) * tick
	s.Children = time.Duration(ticks[2]+ticks[3]) * tick

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "VmHWM":
			s.HWM, err = parseKB(val)
		case "VmRSS":
			s.RSS, err = parseKB(val)
		}
		if err != nil {
			return s, fmt.Errorf("/proc/%d/status %s: %w", pid, key, err)
		}
	}
	if s.HWM == 0 {
		return s, fmt.Errorf("/proc/%d/status has no VmHWM (a zombie?)", pid)
	}
	return s, nil
}

// parseKB parses a "  1234 kB" value into bytes.
func parseKB(v string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
	return n * 1024, err
}

// resetPeak sets the process's VmHWM back to its current RSS, so the next
// reading gives the peak of one phase only (proc(5), clear_refs value 5).
func resetPeak(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS of pid %d: %w", pid, err)
	}
	return nil
}

// cgroupCPU reads the CPU time of every process that ever ran in a cgroup
// (usage_usec of cpu.stat, kept by the kernel even without the cpu
// controller), running children included.
func cgroupCPU(dir string) (time.Duration, error) {
	data, err := os.ReadFile(dir + "/cpu.stat")
	if err != nil {
		return 0, fmt.Errorf("read CPU time of cgroup %s: %w", dir, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond, err
		}
	}
	return 0, fmt.Errorf("%s/cpu.stat has no usage_usec", dir)
}

// phaseMeter measures one phase of one proxy process.
type phaseMeter struct {
	pid         int
	cgroup      string // the proxy's own cgroup, or ""
	start       procSample
	startCgroup time.Duration
	began       time.Time
}

// startPhase resets the peak RSS and records the CPU times so far. With a
// cgroup that holds the proxy and nothing else, children's CPU comes from
// the cgroup and includes children still running at the end of the phase
// (an iptables-restore that has committed its rules but not been reaped
// yet); without one, from the children the process has reaped.
func startPhase(pid int, cgroup string) (*phaseMeter, error) {
	if err := resetPeak(pid); err != nil {
		return nil, err
	}
	m := &phaseMeter{pid: pid, cgroup: cgroup}
	var err error
	if m.start, err = readProc(pid); err != nil {
		return nil, err
	}
	if cgroup != "" {
		if m.startCgroup, err = cgroupCPU(cgroup); err != nil {
			return nil, err
		}
	}
	m.began = time.Now()
	return m, nil
}

// end returns the phase's cost: CPU spent during it and the peak RSS
// reached in it.
func (m *phaseMeter) end() (Resources, error) {
	s, err := readProc(m.pid)
	if err != nil {
		return Resources{}, err
	}
	own := s.CPU - m.start.CPU
	children := s.Children - m.start.Children
	if m.cgroup != "" {
		total, err := cgroupCPU(m.cgroup)
		if err != nil {
			return Resources{}, err
		}
		// The two counters tick at different granularity; never report
		// a negative remainder.
		children = max(0, total-m.startCgroup-own)
	}
	return Resources{
		WallSeconds:        time.Since(m.began).Seconds(),
		CPUSeconds:         own.Seconds(),
		ChildrenCPUSeconds: children.Seconds(),
		PeakRSSBytes:       s.HWM,
		RSSBytes:           s.RSS,
	}, nil
}
