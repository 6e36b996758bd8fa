package main

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kpr-io/kpr/desired"
)

// kubeProxyFlags are kube-proxy's command-line flags that `kpr run` takes
// besides its own, so that a kube-proxy DaemonSet's arguments (kubeadm's
// `--config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)`)
// start kpr unchanged. Flags both share (--kubeconfig, --hostname-override,
// --cluster-cidr, --nodeport-addresses, --healthz-bind-address,
// --metrics-bind-address, --profiling) are kpr's own.
type kubeProxyFlags struct {
	config      string
	master      string
	proxyMode   string
	bindAddress string
	qps         float32
	burst       int32
	contentType string
	verbosity   int
	// loggingFormat is --logging-format, kube-proxy's --log-format.
	loggingFormat string
	// kube-proxy's per-mode periods; resolve maps those of the mode kpr
	// runs onto --sync-period and --min-sync-period.
	iptablesSync, iptablesMinSync, ipvsSync, ipvsMinSync time.Duration
	masqueradeAll                                        bool
	// localhostNodePorts is --iptables-localhost-nodeports.
	localhostNodePorts bool
	showVersion        versionFlag
	// modeNote says what kube-proxy's mode means to kpr, for the log.
	modeNote string
	// bindAddressHardFail makes a health or metrics server that cannot
	// serve fatal; without it kpr tries again (serve.go).
	bindAddressHardFail bool
	// healthzPort and metricsPort are kube-proxy's hidden flags: the port
	// of a bind address given without one.
	healthzPort, metricsPort int32
	// cleanup and initOnly are kube-proxy's one-off jobs: remove every
	// proxy mode's state, or do the privileged node setup; then exit.
	cleanup, initOnly bool
	// ignored collects "--name=value" of the kube-proxy flags given that
	// mean nothing to kpr, for the start-up warning.
	ignored []string
}

// kubeProxyOnlyFlags are kube-proxy's flags that kpr accepts and ignores,
// with whether each is a boolean (which may be given without a value).
// Each is a setting of a mechanism kpr does not have: iptables marks and
// conntrack sysctls (the conntrack timeouts kube-proxy also has are kpr
// flags of its own: they set the tc programs' conntrack lifetimes), IPVS, the OOM score (the
// kubelet's job for a Pod), the config watcher, component-base logging's
// streams, buffers and per-file verbosity (its format and -v are kpr's).
var kubeProxyOnlyFlags = map[string]bool{
	"config-sync-period":              false,
	"feature-gates":                   false,
	"iptables-masquerade-bit":         false,
	"log-flush-frequency":             false,
	"log-json-info-buffer-size":       false,
	"log-json-split-stream":           true,
	"log-text-info-buffer-size":       false,
	"log-text-split-stream":           true,
	"oom-score-adj":                   false,
	"show-hidden-metrics-for-version": false,
	"vmodule":                         false,
}

// kubeProxyExitFlags are kube-proxy's flags that make it do a one-off job
// and exit. Running the daemon instead would surprise whoever gave them,
// so kpr refuses them and says what to run.
var kubeProxyExitFlags = map[string]string{
	"write-config-to": "kpr does not write kube-proxy configurations; kube-proxy --write-config-to does",
}

func addKubeProxyFlags(fl *pflag.FlagSet, k *kubeProxyFlags) {
	fl.StringVar(&k.config, "config", "", "kube-proxy's configuration file (a KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1); as in kube-proxy, it wins over the kube-proxy flags but --hostname-override, --master and the logging flags")
	fl.StringVar(&k.master, "master", "", "the API server's address (host:port or URL), in place of the kubeconfig's server or the in-cluster address; "+
		"without --kubeconfig kpr authenticates as its Pod's ServiceAccount. Nodes where kpr is the only Service proxy need it: "+
		"the kubernetes Service's ClusterIP works only once kpr has synced")
	fl.StringVar(&k.master, "k8s-api-server", "", "the same as --master")
	fl.StringVar(&k.proxyMode, "proxy-mode", "", "kube-proxy's name for --mode")
	fl.StringVar(&k.bindAddress, "bind-address", "", "kube-proxy's idea of the node's primary IP; kpr takes the node's addresses from its Node object, so only 0.0.0.0 and :: are without effect")
	fl.Float32Var(&k.qps, "kube-api-qps", 0, "requests per second to the API server; 0 keeps client-go's default (5)")
	fl.Int32Var(&k.burst, "kube-api-burst", 0, "request burst to the API server; 0 keeps client-go's default (10)")
	fl.StringVar(&k.contentType, "kube-api-content-type", "", "encoding of requests to the API server: application/vnd.kubernetes.protobuf (the default) or application/json")
	fl.IntVarP(&k.verbosity, "v", "v", 0, "kube-proxy's (klog's) log verbosity: kpr logs the V(n) lines up to it, its own debug lines at 4 and client-go's as in kube-proxy; "+
		"the same as --log-level=N, which wins when both are given")
	fl.StringVar(&k.loggingFormat, "logging-format", "", "kube-proxy's log format: text (kpr's text lines, without klog's header) or json, "+
		"the same as --log-format, which wins when both are given")
	fl.DurationVar(&k.iptablesSync, "iptables-sync-period", 0, "kube-proxy's --sync-period (unless --proxy-mode is ipvs)")
	fl.DurationVar(&k.iptablesMinSync, "iptables-min-sync-period", 0, "kube-proxy's --min-sync-period (unless --proxy-mode is ipvs)")
	fl.DurationVar(&k.ipvsSync, "ipvs-sync-period", 0, "kube-proxy's --sync-period with --proxy-mode ipvs")
	fl.DurationVar(&k.ipvsMinSync, "ipvs-min-sync-period", 0, "kube-proxy's --min-sync-period with --proxy-mode ipvs")
	fl.BoolVar(&k.masqueradeAll, "masquerade-all", false, "iptables and ipvs modes: masquerade all traffic to ClusterIPs, as kube-proxy's flag; "+
		"the eBPF mode translates in the socket and does not SNAT, so there it is warned about")
	fl.BoolVar(&k.localhostNodePorts, "iptables-localhost-nodeports", true, "serve NodePorts on loopback (where --nodeport-addresses covers it), as kube-proxy's flag: in the iptables mode on 127.0.0.1, "+
		"which sets route_localnet and drops packets to 127.0.0.0/8 from outside (KUBE-FIREWALL); in the eBPF mode on 127.0.0.1 and ::1. "+
		"false serves no NodePort on loopback in any mode, and leaves route_localnet as it is")
	fl.VarPF(&k.showVersion, "version", "", "print kpr's version and exit; --version=raw prints every field of it, as kube-proxy's").NoOptDefVal = "true"
	fl.BoolVar(&k.bindAddressHardFail, "bind-address-hard-fail", false, "exit when the health or metrics server cannot serve (a port in use); "+
		"without it kpr logs the error and tries again every 5s, as kube-proxy")
	fl.Int32Var(&k.healthzPort, "healthz-port", 10256, "port of a --healthz-bind-address given without one, as kube-proxy's hidden flag")
	fl.Int32Var(&k.metricsPort, "metrics-port", 10249, "port of a --metrics-bind-address given without one, as kube-proxy's hidden flag")
	fl.BoolVar(&k.cleanup, "cleanup", false, "remove every proxy mode's state from the node and exit, as kube-proxy's: "+
		"kpr's (as kpr cleanup) and upstream kube-proxy's (as kpr cleanup --kube-proxy)")
	fl.BoolVar(&k.initOnly, "init-only", false, "do the node setup that needs full privileges (the conntrack and mode sysctls, bpffs) for the mode "+
		"kpr would run, and exit, as kube-proxy's; kpr run needs the same privileges afterwards in the eBPF mode")
	_ = fl.MarkHidden("healthz-port")
	_ = fl.MarkHidden("metrics-port")
	for _, name := range sortedKeys(kubeProxyOnlyFlags) {
		f := fl.VarPF(&ignoredFlag{name: name, into: &k.ignored, boolean: kubeProxyOnlyFlags[name]}, name, "", "kube-proxy's flag; it means nothing to kpr, which warns and goes on")
		if kubeProxyOnlyFlags[name] {
			f.NoOptDefVal = "true"
		}
	}
	for _, name := range sortedKeys(kubeProxyExitFlags) {
		f := fl.VarPF(&exitFlag{name: name}, name, "", "kube-proxy's flag, refused: "+kubeProxyExitFlags[name])
		if name != "write-config-to" {
			f.NoOptDefVal = "true"
		}
	}
}

// ignoredFlag is a kube-proxy flag kpr accepts and does nothing with
// beyond naming it in the start-up warning.
type ignoredFlag struct {
	name    string
	value   string
	into    *[]string
	boolean bool
}

func (f *ignoredFlag) String() string { return f.value }
func (f *ignoredFlag) Type() string {
	if f.boolean {
		return "bool" // so that --help shows no value name, as for kube-proxy's
	}
	return "string"
}
func (f *ignoredFlag) Set(v string) error {
	f.value = v
	*f.into = append(*f.into, "--"+f.name+"="+v)
	return nil
}

// exitFlag is a kube-proxy flag for a one-off job, refused when given.
type exitFlag struct{ name string }

func (f *exitFlag) String() string { return "" }
func (f *exitFlag) Type() string   { return "string" }
func (f *exitFlag) Set(v string) error {
	if f.name != "write-config-to" && v == "false" {
		return nil
	}
	return fmt.Errorf("kube-proxy's --%s is a one-off job, not a daemon setting: %s", f.name, kubeProxyExitFlags[f.name])
}

// resolveProxyMode settles what kube-proxy's mode (--proxy-mode, or the
// file's mode, whichever applies; k.proxyMode holds it by now) means to
// kpr. A kube-proxy mode names how kube-proxy programmed the node: for kpr
// a netfilter mode (iptables, ipvs, nftables) names the fallback where
// eBPF cannot run, so kpr runs --mode auto with that --fallback-mode
// (kpr's own --mode and --fallback-mode, when given, win). Any other value
// (ebpf, auto) is the mode. It returns the line to log about it, if any.
func resolveProxyMode(k *kubeProxyFlags, f *runFlags, changed func(string) bool) (string, error) {
	if k.proxyMode == "" {
		return "", nil
	}
	if m := modeOf(backend(k.proxyMode)); m != nil && m.fallback {
		if !changed("fallback-mode") {
			f.fallbackMode = k.proxyMode
		}
		if changed("mode") {
			return "", nil
		}
		return fmt.Sprintf("kube-proxy's mode %q names kpr's fallback: kpr runs the eBPF dataplane where the kernel has its hooks, "+
			"and the %s mode where it does not (give --mode %s to run that everywhere)", k.proxyMode, k.proxyMode, k.proxyMode), nil
	}
	if changed("mode") && k.proxyMode != f.mode {
		return "", fmt.Errorf("--mode %q and kube-proxy's mode %q disagree; give one of them", f.mode, k.proxyMode)
	}
	f.mode = k.proxyMode
	return "", nil
}

// kubeProxyMode is the mode kube-proxy would run: the one whose section of
// the file, and whose --*-sync-period flags, it reads.
func (f *runFlags) kubeProxyMode() string {
	if f.kubeProxy.proxyMode != "" {
		return f.kubeProxy.proxyMode
	}
	return f.mode
}

// resolveKubeProxyFlags applies the other kube-proxy flags given (changed
// names them) to kpr's settings, where kpr's own flag was not given too,
// and returns the flags kpr ignores. It runs after the configuration file
// is applied; beside --config, only the flags kube-proxy applies over the
// file are still marked changed by then (dropFlagsUnderConfig); f.mode is final by then, and the sync
// periods that apply depend on it.
func resolveKubeProxyFlags(k *kubeProxyFlags, f *runFlags, g *globalFlags, changed func(string) bool) ([]string, error) {
	ignored := slices.Clone(k.ignored)
	// An address without a port takes --healthz-port or --metrics-port, as
	// kube-proxy's do.
	f.healthzAddr = withDefaultPort(f.healthzAddr, strconv.Itoa(int(k.healthzPort)))
	f.metricsAddr = withDefaultPort(f.metricsAddr, strconv.Itoa(int(k.metricsPort)))
	sync, minSync := "iptables-sync-period", "iptables-min-sync-period"
	syncVal, minSyncVal := k.iptablesSync, k.iptablesMinSync
	otherSync, otherMinSync := "ipvs-sync-period", "ipvs-min-sync-period"
	if f.kubeProxyMode() == string(backendIPVS) {
		sync, minSync, otherSync, otherMinSync = otherSync, otherMinSync, sync, minSync
		syncVal, minSyncVal = k.ipvsSync, k.ipvsMinSync
	}
	if changed(sync) && !changed("sync-period") {
		f.syncPeriod = syncVal
	}
	if changed(minSync) && !changed("min-sync-period") {
		f.minSyncPeriod = minSyncVal
	}
	for _, name := range []string{otherSync, otherMinSync} {
		if changed(name) {
			ignored = append(ignored, "--"+name+" (kube-proxy uses it only in another mode)")
		}
	}
	if changed("bind-address") {
		ip := net.ParseIP(k.bindAddress)
		if ip == nil {
			return nil, fmt.Errorf("--bind-address %q: want an IP address", k.bindAddress)
		}
		if !ip.IsUnspecified() {
			ignored = append(ignored, "--bind-address="+k.bindAddress+" (kpr takes the node's addresses from its Node object)")
		}
	}

	if changed("v") && !changed("log-level") {
		level, err := verbositySetting("-v", k.verbosity)
		if err != nil {
			return nil, err
		}
		g.logLevel = level
	}
	if changed("logging-format") && !changed("log-format") {
		if err := checkLogFormat("--logging-format", k.loggingFormat); err != nil {
			return nil, err
		}
		g.logFormat = k.loggingFormat
	}
	return ignored, nil
}

// kubeProxyArgs lets kpr be started with a kube-proxy command line, which
// names no subcommand: arguments that are all flags, other than a lone
// --help, are `kpr run`'s (`kpr --version` too: run's --version prints
// it; cobra's own version flag would link text/template, whose reflection
// keeps the linker from dropping unused methods, 4 MB of binary).
// Anything else is left to cobra.
func kubeProxyArgs(args []string, root *cobra.Command) []string {
	if len(args) == 0 {
		return args
	}
	subcommands := map[string]bool{"help": true, "completion": true}
	for _, c := range root.Commands() {
		subcommands[c.Name()] = true
		for _, a := range c.Aliases {
			subcommands[a] = true
		}
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if subcommands[a] || a == "-h" || a == "--help" {
			return args
		}
	}
	if !strings.HasPrefix(args[0], "-") {
		return args
	}
	return append([]string{"run"}, args...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// localhostNodePorts reports whether the iptables mode serves NodePorts on
// 127.0.0.1: as kube-proxy, only with --iptables-localhost-nodeports and
// where --nodeport-addresses covers IPv4 loopback.
func (f *runFlags) localhostNodePorts() bool {
	npa, err := desired.ParseNodePortAddresses(f.nodePortAddresses)
	return err == nil && f.kubeProxy.localhostNodePorts && npa.Covers(netip.MustParseAddr("127.0.0.1"))
}
