package syncperf

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcStats is what a process has used so far.
type ProcStats struct {
	// CPU is user plus system time.
	CPU time.Duration
	// PeakRSS is the resident set high-water mark (VmHWM).
	PeakRSS uint64
	// RSSFile is the resident part mapped from files, mostly the kpr
	// binary (RssFile), at the time of reading: part of PeakRSS that no
	// change to kpr's heap reduces.
	RSSFile uint64
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/PID/stat. It is
// 100 on every Linux architecture kpr supports (the kernel ABI fixes it).
const clockTicks = 100

// ReadProcStats reads the CPU time and peak RSS of a running process.
func ReadProcStats(pid int) (ProcStats, error) {
	var st ProcStats
	var err error
	if st.CPU, err = readCPU(pid); err != nil {
		return st, err
	}
	if st.PeakRSS, err = readStatusKB(pid, "VmHWM:"); err != nil {
		return st, err
	}
	if st.RSSFile, err = readStatusKB(pid, "RssFile:"); err != nil {
		return st, err
	}
	return st, nil
}

// readCPU returns the user plus system time of a process.
func readCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read CPU time of pid %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are plain. utime and stime are fields 14 and 15.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields: %q", pid, stat)
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: CPU field %q: %w", pid, f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// readStatusKB returns a size line of /proc/PID/status, e.g. "VmHWM:", in
// bytes.
func readStatusKB(pid int, field string) (uint64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read memory use of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: %s %q: %w", pid, field, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s line", pid, field)
}
