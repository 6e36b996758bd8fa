package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// kubeProxyCodecs decode KubeProxyConfiguration files strictly: unknown
// and duplicate fields are reported (and the file is still used, as
// kube-proxy does, so a typo costs a warning and not the node).
var kubeProxyCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	utilruntime.Must(kubeproxyconfig.AddToScheme(s))
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// ignoredSettings are the kube-proxy settings given that kpr does not
// use, all named in one warning at start-up.
type ignoredSettings struct {
	// unsupported are the configuration file's fields, path=value.
	unsupported []string
	// unknown are the file's fields that KubeProxyConfiguration lacks.
	unknown []string
	// flags are kube-proxy flags, --name=value.
	flags []string
	// underConfig are kube-proxy flags given beside --config, which
	// kube-proxy, and so kpr, ignores in favour of the file.
	underConfig []string
}

func (s ignoredSettings) empty() bool {
	return len(s.unsupported)+len(s.unknown)+len(s.flags)+len(s.underConfig) == 0
}

// fields are the warning's fields, one per non-empty list.
func (s ignoredSettings) fields() []zap.Field {
	var fs []zap.Field
	for _, l := range []struct {
		key  string
		list []string
	}{{"unsupportedConfigFields", s.unsupported}, {"unknownConfigFields", s.unknown}, {"ignoredFlags", s.flags},
		{"flagsOverriddenByConfig", s.underConfig}} {
		if len(l.list) > 0 {
			fs = append(fs, zap.Strings(l.key, l.list))
		}
	}
	return fs
}

// resolveSettings folds kube-proxy's configuration file and flags into
// kpr's settings, with kube-proxy's precedence. Without --config: kpr's own
// flags, then kube-proxy's flags, then the defaults. With --config, as
// kube-proxy: kpr's own flags, then the file, then the defaults; of
// kube-proxy's flags (and kpr's flags of the same names) only those of
// flagsOverConfig count, and the others given are named in the warning.
// fs holds the command line, parsed.
func resolveSettings(f *runFlags, g *globalFlags, fs *pflag.FlagSet) (ignoredSettings, error) {
	var ignored ignoredSettings
	k := &f.kubeProxy
	if k.config != "" {
		var err error
		if ignored.underConfig, err = dropFlagsUnderConfig(fs, k); err != nil {
			return ignored, err
		}
	}
	changed := fs.Changed
	if k.config != "" {
		cfg, unknown, err := loadKubeProxyConfig(k.config)
		if err != nil {
			return ignored, err
		}
		ignored.unknown = unknown
		if ignored.unsupported, err = applyKubeProxyConfig(cfg, f, g, changed); err != nil {
			return ignored, err
		}
	}
	var err error
	if k.modeNote, err = resolveProxyMode(k, f, changed); err != nil {
		return ignored, err
	}
	ignored.flags, err = resolveKubeProxyFlags(k, f, g, changed)
	return ignored, err
}

// kubeProxyFlagNames are kube-proxy 1.37's flags (`kube-proxy --help`,
// and the hidden --healthz-port and --metrics-port).
var kubeProxyFlagNames = []string{
	"bind-address", "bind-address-hard-fail", "cleanup", "cluster-cidr", "config", "config-sync-period",
	"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-be-liberal", "conntrack-tcp-timeout-close-wait",
	"conntrack-tcp-timeout-established", "conntrack-udp-timeout", "conntrack-udp-timeout-stream",
	"detect-local-mode", "feature-gates", "healthz-bind-address", "healthz-port", "help", "hostname-override",
	"init-only", "iptables-localhost-nodeports", "iptables-masquerade-bit", "iptables-min-sync-period",
	"iptables-sync-period", "ipvs-exclude-cidrs", "ipvs-min-sync-period", "ipvs-scheduler", "ipvs-strict-arp",
	"ipvs-sync-period", "ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout", "kube-api-burst",
	"kube-api-content-type", "kube-api-qps", "kubeconfig", "log-flush-frequency", "log-json-info-buffer-size",
	"log-json-split-stream", "log-text-info-buffer-size", "log-text-split-stream", "logging-format",
	"masquerade-all", "master", "metrics-bind-address", "metrics-port", "nodeport-addresses", "oom-score-adj",
	"pod-bridge-interface", "pod-interface-name-prefix", "profiling", "proxy-mode",
	"show-hidden-metrics-for-version", "v", "version", "vmodule", "write-config-to",
}

// flagsOverConfig are the kube-proxy flags that still count beside
// --config: kube-proxy applies the node name and the API server address
// after loading the file, copies its logging flags over the file's logging
// section, and the rest are not settings.
var flagsOverConfig = map[string]bool{
	"hostname-override": true, "master": true,
	"v": true, "vmodule": true, "logging-format": true, "log-flush-frequency": true,
	"log-json-info-buffer-size": true, "log-json-split-stream": true,
	"log-text-info-buffer-size": true, "log-text-split-stream": true,
	"config": true, "cleanup": true, "init-only": true, "write-config-to": true, "version": true, "help": true,
}

// dropFlagsUnderConfig undoes every kube-proxy flag given beside --config
// that kube-proxy would ignore for the file (kpr's flags of the same names
// included: they stand for kube-proxy's), so that the file, or the
// default where the file is silent, applies, as in kube-proxy. It returns
// them as --name=value, for the warning.
func dropFlagsUnderConfig(fs *pflag.FlagSet, k *kubeProxyFlags) ([]string, error) {
	var dropped []string
	for _, name := range kubeProxyFlagNames {
		fl := fs.Lookup(name)
		if flagsOverConfig[name] || fl == nil || !fl.Changed {
			continue
		}
		dropped = append(dropped, "--"+name+"="+fl.Value.String())
		if _, ok := fl.Value.(*ignoredFlag); ok {
			// Named once, here, rather than also as meaningless.
			k.ignored = slices.DeleteFunc(k.ignored, func(s string) bool { return strings.HasPrefix(s, "--"+name+"=") })
		} else if err := resetFlag(fl); err != nil {
			return nil, fmt.Errorf("--%s: restore its default under --config: %w", name, err)
		}
		fl.Changed = false
	}
	return dropped, nil
}

// resetFlag gives fl its default value back.
func resetFlag(fl *pflag.Flag) error {
	if sv, ok := fl.Value.(pflag.SliceValue); ok {
		def := strings.Trim(fl.DefValue, "[]")
		var vals []string
		if def != "" {
			vals = strings.Split(def, ",")
		}
		return sv.Replace(vals)
	}
	return fl.Value.Set(fl.DefValue)
}

// loadKubeProxyConfig reads a kube-proxy configuration file. unknown lists
// the fields the file has and the type does not (typos, or fields of a
// newer kube-proxy).
func loadKubeProxyConfig(path string) (cfg *kubeproxyconfig.KubeProxyConfiguration, unknown []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	obj, gvk, err := kubeProxyCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if strict, ok := runtime.AsStrictDecodingError(err); ok {
		for _, e := range strict.Errors() {
			unknown = append(unknown, e.Error())
		}
	} else if err != nil {
		return nil, nil, fmt.Errorf("--config %s: want a %s KubeProxyConfiguration: %w", path, kubeproxyconfig.SchemeGroupVersion, err)
	}
	cfg, ok := obj.(*kubeproxyconfig.KubeProxyConfiguration)
	if !ok {
		return nil, nil, fmt.Errorf("--config %s holds a %s, want a %s KubeProxyConfiguration", path, gvk, kubeproxyconfig.SchemeGroupVersion)
	}
	return cfg, unknown, nil
}

// applyKubeProxyConfig copies what kpr supports of cfg into f and g, for
// each setting whose kpr flag was not given (changed names the flags
// given and still counted: kpr's own flags, and the kube-proxy flags that
// kube-proxy applies over the file). It returns the fields
// cfg sets that kpr does not support, by their JSON paths.
//
// A field counts as set when it is not its type's zero value: kube-proxy
// defaults zero fields, and kubeadm writes every field out, mostly as
// zeros. Supported fields are consumed as they are applied; whatever set
// field is left is unsupported, so a field kpr has never heard of is named
// rather than ignored.
func applyKubeProxyConfig(cfg *kubeproxyconfig.KubeProxyConfiguration, f *runFlags, g *globalFlags, changed func(string) bool) ([]string, error) {
	set, err := setFields(cfg)
	if err != nil {
		return nil, err
	}
	consume := func(path string) { delete(set, path) }
	// apply sets a kpr flag from a file field, unless the flag was given.
	apply := func(flag, path string, do func()) {
		if _, ok := set[path]; !ok {
			return
		}
		consume(path)
		if !changed(flag) {
			do()
		}
	}
	for _, name := range []string{"apiVersion", "kind"} {
		consume(name)
	}

	cc := cfg.ClientConnection
	apply("kubeconfig", "clientConnection.kubeconfig", func() { f.kubeconfig = cc.Kubeconfig })
	apply("kube-api-qps", "clientConnection.qps", func() { f.kubeProxy.qps = cc.QPS })
	apply("kube-api-burst", "clientConnection.burst", func() { f.kubeProxy.burst = cc.Burst })
	apply("kube-api-content-type", "clientConnection.contentType", func() { f.kubeProxy.contentType = cc.ContentType })
	apply("hostname-override", "hostnameOverride", func() { f.hostnameOverride = cfg.HostnameOverride })
	apply("healthz-bind-address", "healthzBindAddress", func() { f.healthzAddr = withDefaultPort(cfg.HealthzBindAddress, "10256") })
	apply("metrics-bind-address", "metricsBindAddress", func() { f.metricsAddr = withDefaultPort(cfg.MetricsBindAddress, "10249") })
	apply("profiling", "enableProfiling", func() { f.profiling = cfg.EnableProfiling })
	apply("cluster-cidr", "clusterCIDR", func() { f.clusterCIDR = cfg.ClusterCIDR })
	apply("detect-local-mode", "detectLocalMode", func() { f.detectLocal.mode = string(cfg.DetectLocalMode) })
	apply("pod-bridge-interface", "detectLocal.bridgeInterface", func() { f.detectLocal.bridge = cfg.DetectLocal.BridgeInterface })
	apply("pod-interface-name-prefix", "detectLocal.interfaceNamePrefix", func() { f.detectLocal.interfacePrefix = cfg.DetectLocal.InterfaceNamePrefix })
	apply("masquerade-all", "iptables.masqueradeAll", func() { f.kubeProxy.masqueradeAll = cfg.IPTables.MasqueradeAll })
	apply("ipvs-scheduler", "ipvs.scheduler", func() { f.ipvs.scheduler = cfg.IPVS.Scheduler })
	apply("ipvs-strict-arp", "ipvs.strictARP", func() { f.ipvs.strictARP = cfg.IPVS.StrictARP })
	apply("ipvs-tcp-timeout", "ipvs.tcpTimeout", func() { f.ipvs.timeouts.TCP = cfg.IPVS.TCPTimeout.Duration })
	apply("ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", func() { f.ipvs.timeouts.TCPFin = cfg.IPVS.TCPFinTimeout.Duration })
	apply("ipvs-udp-timeout", "ipvs.udpTimeout", func() { f.ipvs.timeouts.UDP = cfg.IPVS.UDPTimeout.Duration })
	apply("ipvs-exclude-cidrs", "ipvs.excludeCIDRs", func() { f.ipvs.excludeCIDRs = slices.Clone(cfg.IPVS.ExcludeCIDRs) })
	apply("nodeport-addresses", "nodePortAddresses", func() { f.nodePortAddresses = slices.Clone(cfg.NodePortAddresses) })
	// The file's mode is kube-proxy's, as --proxy-mode (resolveProxyMode).
	apply("proxy-mode", "mode", func() { f.kubeProxy.proxyMode = string(cfg.Mode) })

	// kube-proxy reads the sync periods of the section of its mode; kpr
	// takes them from the same section. Those of the other sections are
	// left, and named as unsupported if set.
	section := "iptables" // kube-proxy's default mode, and the section kubeadm fills
	syncPeriod, minSyncPeriod := cfg.IPTables.SyncPeriod, cfg.IPTables.MinSyncPeriod
	switch f.kubeProxyMode() {
	case string(backendIPVS):
		section, syncPeriod, minSyncPeriod = "ipvs", cfg.IPVS.SyncPeriod, cfg.IPVS.MinSyncPeriod
	case "nftables":
		section, syncPeriod, minSyncPeriod = "nftables", cfg.NFTables.SyncPeriod, cfg.NFTables.MinSyncPeriod
	}
	apply("sync-period", section+".syncPeriod", func() { f.syncPeriod = syncPeriod.Duration })
	apply("min-sync-period", section+".minSyncPeriod", func() { f.minSyncPeriod = minSyncPeriod.Duration })

	// The conntrack section's pointers are read themselves: null keeps
	// kube-proxy's default, and an explicit 0 leaves the sysctl, which
	// setFields cannot tell from null.
	ct := cfg.Conntrack
	for _, p := range []struct {
		flag, path string
		set        bool
		do         func()
	}{
		{"conntrack-max-per-core", "conntrack.maxPerCore", ct.MaxPerCore != nil, func() { f.conntrack.maxPerCore = *ct.MaxPerCore }},
		{"conntrack-min", "conntrack.min", ct.Min != nil, func() { f.conntrack.min = *ct.Min }},
		{"conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout != nil,
			func() { f.conntrack.tcpEstablished = ct.TCPEstablishedTimeout.Duration }},
		{"conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout != nil,
			func() { f.conntrack.tcpCloseWait = ct.TCPCloseWaitTimeout.Duration }},
	} {
		consume(p.path)
		if p.set && !changed(p.flag) {
			p.do()
		}
	}
	apply("conntrack-tcp-be-liberal", "conntrack.tcpBeLiberal", func() { f.conntrack.tcpBeLiberal = ct.TCPBeLiberal })
	apply("conntrack-udp-timeout", "conntrack.udpTimeout", func() { f.conntrack.udp = ct.UDPTimeout.Duration })
	apply("conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", func() { f.conntrack.udpStream = ct.UDPStreamTimeout.Duration })

	// A value that asks for kube-proxy's own behaviour, which kpr has
	// anyway: binding to every address.
	if ip := net.ParseIP(cfg.BindAddress); ip != nil && ip.IsUnspecified() {
		consume("bindAddress")
	}
	// Unset (null) keeps the default, true; false counts as unset for
	// setFields, so the pointer itself is read.
	if p := cfg.IPTables.LocalhostNodePorts; p != nil {
		consume("iptables.localhostNodePorts")
		if !changed("iptables-localhost-nodeports") {
			f.kubeProxy.localhostNodePorts = *p
		}
	}

	// The file's logging section yields to kpr's own flags and to
	// kube-proxy's, which kube-proxy copies over it.
	if v := int(cfg.Logging.Verbosity); v != 0 && !changed("log-level") && !changed("v") {
		level, err := verbositySetting("--config: logging.verbosity", v)
		if err != nil {
			return nil, err
		}
		g.logLevel = level
	}
	consume("logging.verbosity")
	if format := cfg.Logging.Format; format != "" {
		if err := checkLogFormat("--config: logging.format", format); err != nil {
			return nil, err
		}
		if !changed("logging-format") {
			apply("log-format", "logging.format", func() { g.logFormat = format })
		}
	}
	consume("logging.format")

	unsupported := make([]string, 0, len(set))
	for path, value := range set {
		unsupported = append(unsupported, path+"="+value)
	}
	slices.Sort(unsupported)
	return unsupported, nil
}

// setFields returns the fields of cfg that are set (not zero), by their
// JSON paths ("iptables.masqueradeAll"), with their values as JSON.
// Walking the JSON form rather than the Go struct names fields as the file
// does, and reaches fields of every nested type alike.
func setFields(cfg *kubeproxyconfig.KubeProxyConfiguration) (map[string]string, error) {
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("--config: re-encode the configuration: %w", err)
	}
	var tree map[string]any
	if err := json.Unmarshal(data, &tree); err != nil {
		return nil, fmt.Errorf("--config: re-decode the configuration: %w", err)
	}
	set := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, child)
			}
			return
		case nil, bool:
			if v == nil || v == false {
				return
			}
		case float64:
			if v == 0 {
				return
			}
		case string:
			// Durations and quantities encode their zero as "0s" and "0".
			if v == "" || v == "0s" || v == "0" {
				return
			}
		case []any:
			if len(v) == 0 {
				return
			}
		}
		b, _ := json.Marshal(v)
		set[prefix] = string(b)
	}
	walk("", tree)
	return set, nil
}

// withDefaultPort adds port to an address given without one: kube-proxy's
// configuration accepts "0.0.0.0" for its bind addresses.
func withDefaultPort(addr, port string) string {
	if _, _, err := net.SplitHostPort(addr); err == nil || addr == "" {
		return addr
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), port)
}
