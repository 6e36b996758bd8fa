package netfilter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// ConntrackSysctls are kube-proxy's conntrack settings (its --conntrack-*
// flags and the configuration file's conntrack section), which it writes
// into the node's netfilter sysctls at start-up whatever its mode. kpr's
// netfilter modes write them alike, so a node keeps the conntrack table
// size and timeouts kube-proxy gave it. A zero leaves its sysctl as it is,
// as in kube-proxy.
type ConntrackSysctls struct {
	// MaxPerCore times the CPUs, but at least Min, is nf_conntrack_max
	// (capped at 1 Mi entries, as kube-proxy caps it). MaxPerCore 0 leaves
	// nf_conntrack_max alone.
	MaxPerCore, Min int32
	TCPEstablished  time.Duration // nf_conntrack_tcp_timeout_established
	TCPCloseWait    time.Duration // nf_conntrack_tcp_timeout_close_wait
	TCPBeLiberal    bool          // nf_conntrack_tcp_be_liberal = 1; false leaves it
	UDP             time.Duration // nf_conntrack_udp_timeout
	UDPStream       time.Duration // nf_conntrack_udp_timeout_stream
}

// maxConntrackMax is kube-proxy's cap on the scaled nf_conntrack_max, which
// keeps a many-core machine's table from taking gigabytes.
const maxConntrackMax = 1 << 20

// Max is the nf_conntrack_max s asks for on a machine of cpus CPUs, or 0.
func (s ConntrackSysctls) Max(cpus int) int {
	if s.MaxPerCore <= 0 {
		return 0
	}
	scaled := int(s.MaxPerCore) * cpus
	if scaled > maxConntrackMax {
		return maxConntrackMax
	}
	return max(scaled, int(s.Min))
}

// sysctlFS names the files ApplyIn writes; tests point it at a directory
// of their own.
type sysctlFS struct {
	netfilter string // /proc/sys/net/netfilter
	hashsize  string // /sys/module/nf_conntrack/parameters/hashsize
}

var nodeSysctlFS = sysctlFS{
	netfilter: "/proc/sys/net/netfilter",
	hashsize:  "/sys/module/nf_conntrack/parameters/hashsize",
}

// Apply writes s into the sysctls of the calling thread's network
// namespace, as kube-proxy does at start-up, and logs each value it
// changes.
//
// nf_conntrack_max is one value for the whole machine: the kernel lets
// only the initial network namespace write it, and shows it read-only in
// every other. There Apply leaves it, and the conntrack hash size with it
// (a module parameter, also machine-wide), and says so; kube-proxy's
// DaemonSet runs in the node's namespace and so does kpr's.
func (s ConntrackSysctls) Apply(log *zap.Logger) error {
	return s.apply(nodeSysctlFS, runtime.NumCPU(), log)
}

func (s ConntrackSysctls) apply(fs sysctlFS, cpus int, log *zap.Logger) error {
	if want := s.Max(cpus); want > 0 {
		if err := s.applyMax(fs, want, log); err != nil {
			return err
		}
	}
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	for _, c := range []struct {
		name  string
		value int
		set   bool
	}{
		{"nf_conntrack_tcp_timeout_established", seconds(s.TCPEstablished), s.TCPEstablished > 0},
		{"nf_conntrack_tcp_timeout_close_wait", seconds(s.TCPCloseWait), s.TCPCloseWait > 0},
		{"nf_conntrack_tcp_be_liberal", 1, s.TCPBeLiberal},
		{"nf_conntrack_udp_timeout", seconds(s.UDP), s.UDP > 0},
		{"nf_conntrack_udp_timeout_stream", seconds(s.UDPStream), s.UDPStream > 0},
	} {
		if !c.set {
			continue
		}
		if _, err := setIntFile(filepath.Join(fs.netfilter, c.name), c.value, log); err != nil {
			return fmt.Errorf("conntrack setting %s=%d (kube-proxy's --conntrack-* flags and conntrack.* fields; 0 leaves it as it is): %w",
				c.name, c.value, err)
		}
	}
	return nil
}

// applyMax sets nf_conntrack_max, and the hash size to a quarter of it
// when the hash is smaller, as kube-proxy does.
func (s ConntrackSysctls) applyMax(fs sysctlFS, want int, log *zap.Logger) error {
	path := filepath.Join(fs.netfilter, "nf_conntrack_max")
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("conntrack setting nf_conntrack_max=%d: %w (is the nf_conntrack module loaded?)", want, err)
	}
	if st.Mode().Perm()&0o200 == 0 {
		log.Warn("This network namespace cannot set nf_conntrack_max, which only the node's can; leaving it and the conntrack hash size as they are",
			zap.Int("nfConntrackMax", want))
		return nil
	}
	if _, err := setIntFile(path, want, log); err != nil {
		return fmt.Errorf("conntrack setting nf_conntrack_max=%d (--conntrack-max-per-core 0 leaves it as it is): %w", want, err)
	}
	hashsize, err := readIntFile(fs.hashsize)
	if err != nil {
		return fmt.Errorf("read the conntrack hash size: %w", err)
	}
	if hashsize >= want/4 {
		return nil
	}
	if _, err := setIntFile(fs.hashsize, want/4, log); err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS) {
			// A read-only /sys (a container runtime's default) keeps the
			// table at its hash size; kube-proxy warns and goes on too.
			log.Warn("Could not raise the conntrack hash size; lookups in a full table will be slower", zap.Error(err))
			return nil
		}
		return fmt.Errorf("raise the conntrack hash size to %d: %w", want/4, err)
	}
	return nil
}

// setIntFile writes value into the sysctl or parameter file at path unless
// it holds it already, and reports whether it wrote.
func setIntFile(path string, value int, log *zap.Logger) (bool, error) {
	if cur, err := readIntFile(path); err == nil && cur == value {
		return false, nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(value)), 0o644); err != nil {
		return false, err
	}
	log.Info("Set a conntrack setting", zap.String("file", path), zap.Int("value", value))
	return true, nil
}

func readIntFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
