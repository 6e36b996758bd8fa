package helm

import (
	"bufio"
	"fmt"
	"maps"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kpr-io/kpr/tests/deploy"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// Every flag of `kpr run` is in exactly one of the lists below, so that
// the chart leaves none unreachable without saying so:
// TestEveryRunFlagIsReachable fails on a flag that is in none (a new
// flag: decide where it goes) and on an entry that is no flag any more.
//
// The flags are read from `kpr run --help` of the binary built from this
// tree: cmd/kpr is package main, which no other module can import, and
// the help is what the flags' registrations print, in three sections:
// kpr's own flags, kube-proxy's (which beside --config, as the chart
// passes it, count only in the file, as with kube-proxy) and the global
// ones. The two kube-proxy flags that kube-proxy hides (--healthz-port,
// --metrics-port) are hidden there too and not checked: both only
// complete a bind address given without a port, and beside --config, as
// kube-proxy's flags, count for nothing.

// valueFlags are the flags with a value of their own: path is its place
// in values.yaml, value one to set there, and arg what kpr's container
// must then be given. TestEveryRunFlagIsReachable renders the chart with
// all of them set and looks for each arg.
var valueFlags = map[string]struct {
	path  string
	value any
	arg   string
}{
	"mode":                       {"mode", "nftables", "--mode=nftables"},
	"fallback-mode":              {"fallbackMode", "iptables", "--fallback-mode=iptables"},
	"external-ips":               {"externalIPs", "node-local", "--external-ips=node-local"},
	"lb-algorithm":               {"lbAlgorithm", "maglev", "--lb-algorithm=maglev"},
	"maglev-table-size":          {"maglev.tableSize", 65521, "--maglev-table-size=65521"},
	"maglev-hash-seed":           {"maglev.hashSeedSecret.name", "kpr-maglev", "--maglev-hash-seed=$(KPR_MAGLEV_HASH_SEED)"},
	"tc-attach":                  {"tcAttach", "clsact", "--tc-attach=clsact"},
	"snat-port-range":            {"snatPortRange", "60000-60999", "--snat-port-range=60000-60999"},
	"socket-lb":                  {"socketLB", "per-pod", "--socket-lb=per-pod"},
	"socket-lb-sandbox-handlers": {"socketLBSandboxHandlers", []any{"kata*", "my-vm"}, "--socket-lb-sandbox-handlers=kata*,my-vm"},
	"devices":                    {"devices", []any{"eth0", "eth1"}, "--devices=eth0,eth1"},
	"log-level":                  {"logLevel", "warn", "--log-level=warn"},
	"log-format":                 {"logFormat", "console", "--log-format=console"},
	"map-size-services":          {"mapSizes.services", 1024, "--map-size-services=1024"},
	"map-size-backends":          {"mapSizes.backends", 1025, "--map-size-backends=1025"},
	"map-size-revnat":            {"mapSizes.revnat", 1026, "--map-size-revnat=1026"},
	"map-size-sockrev":           {"mapSizes.sockrev", 1027, "--map-size-sockrev=1027"},
	"map-size-affinity":          {"mapSizes.affinity", 1028, "--map-size-affinity=1028"},
	"map-size-conntrack":         {"mapSizes.conntrack", 1029, "--map-size-conntrack=1029"},
	"map-size-conntrack-new":     {"mapSizes.conntrack-new", 1030, "--map-size-conntrack-new=1030"},
	"map-size-src-ranges":        {"mapSizes.src-ranges", 1031, "--map-size-src-ranges=1031"},
	"map-size-frags":             {"mapSizes.frags", 1032, "--map-size-frags=1032"},
}

// configFlags are set through values.yaml's config, the
// KubeProxyConfiguration, at these JSON paths: kube-proxy's flags (kpr
// drops them beside --config, as kube-proxy does) and kpr's sync periods,
// which kpr takes from the file's section of the mode.
var configFlags = map[string]string{
	"bind-address":                      "bindAddress",
	"cluster-cidr":                      "clusterCIDR",
	"conntrack-max-per-core":            "conntrack.maxPerCore",
	"conntrack-min":                     "conntrack.min",
	"conntrack-tcp-be-liberal":          "conntrack.tcpBeLiberal",
	"conntrack-tcp-timeout-close-wait":  "conntrack.tcpCloseWaitTimeout",
	"conntrack-tcp-timeout-established": "conntrack.tcpEstablishedTimeout",
	"conntrack-udp-timeout":             "conntrack.udpTimeout",
	"conntrack-udp-timeout-stream":      "conntrack.udpStreamTimeout",
	"detect-local-mode":                 "detectLocalMode",
	"healthz-bind-address":              "healthzBindAddress",
	"iptables-localhost-nodeports":      "iptables.localhostNodePorts",
	"iptables-min-sync-period":          "iptables.minSyncPeriod",
	"iptables-sync-period":              "iptables.syncPeriod",
	"ipvs-exclude-cidrs":                "ipvs.excludeCIDRs",
	"ipvs-min-sync-period":              "ipvs.minSyncPeriod",
	"ipvs-scheduler":                    "ipvs.scheduler",
	"ipvs-strict-arp":                   "ipvs.strictARP",
	"ipvs-sync-period":                  "ipvs.syncPeriod",
	"ipvs-tcp-timeout":                  "ipvs.tcpTimeout",
	"ipvs-tcpfin-timeout":               "ipvs.tcpFinTimeout",
	"ipvs-udp-timeout":                  "ipvs.udpTimeout",
	"kube-api-burst":                    "clientConnection.burst",
	"kube-api-content-type":             "clientConnection.contentType",
	"kube-api-qps":                      "clientConnection.qps",
	"kubeconfig":                        "clientConnection.kubeconfig",
	"masquerade-all":                    "iptables.masqueradeAll",
	"metrics-bind-address":              "metricsBindAddress",
	"min-sync-period":                   "iptables.minSyncPeriod",
	"nodeport-addresses":                "nodePortAddresses",
	"pod-bridge-interface":              "detectLocal.bridgeInterface",
	"pod-interface-name-prefix":         "detectLocal.interfaceNamePrefix",
	"profiling":                         "enableProfiling",
	"proxy-mode":                        "mode",
	"sync-period":                       "iptables.syncPeriod",
	"v":                                 "logging.verbosity",
}

// chartFlags are what the chart sets itself; kpr's container always has
// them.
var chartFlags = map[string]string{
	"config":            "--config=/etc/kpr/config.conf",
	"hostname-override": "--hostname-override=$(NODE_NAME)",
	"cgroup-root":       "--cgroup-root=/run/kpr/cgroupv2",
}

// otherwiseSet are flags whose setting the chart makes another way.
var otherwiseSet = map[string]string{
	"master":         "apiServer.host and apiServer.port, as KUBERNETES_SERVICE_HOST and _PORT",
	"k8s-api-server": "apiServer.host and apiServer.port, as KUBERNETES_SERVICE_HOST and _PORT",
}

// extraArgsFlags are left to extraArgs on purpose, each for its reason.
// They must be kpr's own or global flags: beside --config kpr ignores
// kube-proxy's.
var extraArgsFlags = map[string]string{
	"host-netns":                "the Pod has the node's network namespace (hostNetwork); another one is for tests",
	"healthcheck-bind-ip":       "rarely changed: the healthCheckNodePorts listen on every address by default, as kube-proxy's",
	"conntrack-tcp-timeout-syn": "tuning of the tc programs' conntrack that kpr's defaults (netfilter's) cover",
	"conntrack-tcp-timeout-fin": "tuning of the tc programs' conntrack that kpr's defaults (netfilter's) cover",
	"conntrack-tcp-timeout-rst": "tuning of the tc programs' conntrack that kpr's defaults (netfilter's) cover",
	"bpf-root":                  "the chart mounts the host's bpffs at /sys/fs/bpf, which holds the default; another root needs another mount too",
}

// notForTheDaemon are flags that a DaemonSet running kpr has no use for.
var notForTheDaemon = map[string]string{
	"help":                            "prints the usage",
	"version":                         "prints the version and exits",
	"cleanup":                         "removes the dataplane and exits: cleanup.enabled does the uninstall",
	"init-only":                       "sets the node up and exits: kpr's container does that itself",
	"write-config-to":                 "refused by kpr",
	"bind-address-hard-fail":          "kube-proxy's; beside --config it counts only as the file's bindAddressHardFail, which kpr does not read (kpr retries a busy port, as kube-proxy by default)",
	"config-sync-period":              "kube-proxy's, ignored by kpr",
	"feature-gates":                   "kube-proxy's, ignored by kpr",
	"iptables-masquerade-bit":         "kube-proxy's, ignored by kpr",
	"log-flush-frequency":             "kube-proxy's, ignored by kpr",
	"log-json-info-buffer-size":       "kube-proxy's, ignored by kpr",
	"log-json-split-stream":           "kube-proxy's, ignored by kpr",
	"log-text-info-buffer-size":       "kube-proxy's, ignored by kpr",
	"log-text-split-stream":           "kube-proxy's, ignored by kpr",
	"logging-format":                  "kube-proxy's, ignored by kpr: logFormat, or config.logging.format",
	"oom-score-adj":                   "kube-proxy's, ignored by kpr: the kubelet sets a Pod's",
	"show-hidden-metrics-for-version": "kube-proxy's, ignored by kpr",
	"vmodule":                         "kube-proxy's, ignored by kpr",
}

// Sections of `kpr run --help`.
const (
	sectionKpr       = "kpr"
	sectionKubeProxy = "kube-proxy"
	sectionGlobal    = "global"
)

var helpFlagLine = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)[ =]`)

// runHelpFlags returns the flags `kpr run --help` lists, by name, with
// the section each is in.
func runHelpFlags(t *testing.T) map[string]string {
	t.Helper()
	kpr, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kpr, "run", "--help").Output()
	if err != nil {
		t.Fatalf("kpr run --help: %v", err)
	}
	flags := map[string]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Flags:":
			section = sectionKpr
			continue
		case strings.HasPrefix(line, "kube-proxy's flags"):
			section = sectionKubeProxy
			continue
		case line == "Global Flags:":
			section = sectionGlobal
			continue
		}
		if m := helpFlagLine.FindStringSubmatch(line); m != nil && section != "" {
			flags[m[1]] = section
		}
	}
	// A help whose layout changed would leave the sections empty.
	for _, s := range []string{sectionKpr, sectionKubeProxy, sectionGlobal} {
		if !slices.Contains(slices.Collect(maps.Values(flags)), s) {
			t.Fatalf("kpr run --help has no flags in its %s section; has its layout changed?\n%s", s, out)
		}
	}
	return flags
}

// TestEveryRunFlagIsReachable checks that every flag of `kpr run` is a
// value of the chart, a field of its config, set by the chart, or listed
// as left to extraArgs or of no use to the daemon, and that each value
// and chart flag reaches kpr's container.
func TestEveryRunFlagIsReachable(t *testing.T) {
	help := runHelpFlags(t)
	lists := map[string][]string{
		"valueFlags":      slices.Collect(maps.Keys(valueFlags)),
		"configFlags":     slices.Collect(maps.Keys(configFlags)),
		"chartFlags":      slices.Collect(maps.Keys(chartFlags)),
		"otherwiseSet":    slices.Collect(maps.Keys(otherwiseSet)),
		"extraArgsFlags":  slices.Collect(maps.Keys(extraArgsFlags)),
		"notForTheDaemon": slices.Collect(maps.Keys(notForTheDaemon)),
	}
	in := map[string][]string{}
	for list, names := range lists {
		for _, n := range names {
			in[n] = append(in[n], list)
			if _, ok := help[n]; !ok {
				t.Errorf("%s lists --%s, which `kpr run --help` does not: remove it", list, n)
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(help)) {
		switch l := in[n]; len(l) {
		case 0:
			t.Errorf("--%s (%s flags of `kpr run`) is reachable neither as a chart value nor through config, nor listed as left to extraArgs: "+
				"give it a value (values.yaml, values.schema.json, templates/daemonset.yaml and valueFlags here), or list it in configFlags, "+
				"extraArgsFlags or notForTheDaemon with the reason", n, help[n])
		case 1:
		default:
			t.Errorf("--%s is in %v; it belongs in one list", n, l)
		}
	}
	for n := range extraArgsFlags {
		if help[n] == sectionKubeProxy {
			t.Errorf("--%s is kube-proxy's, which kpr ignores beside --config: extraArgs cannot set it", n)
		}
	}
	for n := range valueFlags {
		if help[n] == sectionKubeProxy {
			t.Errorf("--%s is kube-proxy's, which kpr ignores beside --config: as a value it must go into the config, not the args", n)
		}
	}

	// Each config path is a field of the KubeProxyConfiguration.
	for n, path := range configFlags {
		if !hasJSONPath(reflect.TypeFor[kubeproxyconfig.KubeProxyConfiguration](), strings.Split(path, ".")) {
			t.Errorf("configFlags: --%s's %s is no field of KubeProxyConfiguration", n, path)
		}
	}

	// Every value set at once: each reaches kpr's args as its flag.
	vals := map[string]any{}
	for _, f := range valueFlags {
		setPath(vals, f.path, f.value)
	}
	objs := byKind(renderChart(t, deploy.Namespace, vals, oldestKube))
	ds := objs["DaemonSet/kpr"]
	if ds == nil {
		t.Fatalf("no DaemonSet kpr in %v", kinds(mapsValues(objs)))
	}
	kpr := container(t, ds, "containers", "kpr")
	args, _, _ := unstructured.NestedStringSlice(kpr, "args")
	for n, f := range valueFlags {
		if !slices.Contains(args, f.arg) {
			t.Errorf("%s=%v gives kpr's args %q, which lack %s (--%s)", f.path, f.value, args, f.arg, n)
		}
	}
	for n, arg := range chartFlags {
		if !slices.Contains(args, arg) {
			t.Errorf("kpr's args %q lack the chart's %s (--%s)", args, arg, n)
		}
	}
	flagsKnown(t, "run", args)
	env, _, _ := unstructured.NestedSlice(kpr, "env")
	if !strings.Contains(fmt.Sprint(env), "kpr-maglev") {
		t.Errorf("maglev.hashSeedSecret.name kpr-maglev: kpr's env %v does not take KPR_MAGLEV_HASH_SEED from that Secret", env)
	}
}

// hasJSONPath says whether the struct type typ has a field at the JSON
// path (json tags, embedded structs inlined).
func hasJSONPath(typ reflect.Type, path []string) bool {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if len(path) == 0 {
		return true
	}
	if typ.Kind() != reflect.Struct {
		return false
	}
	for f := range jsonFields(typ) {
		if f.name == path[0] {
			return hasJSONPath(f.typ, path[1:])
		}
	}
	return false
}

type jsonField struct {
	name string
	typ  reflect.Type
}

// jsonFields yields the JSON fields of the struct type typ, with those
// of embedded (inlined) structs.
func jsonFields(typ reflect.Type) func(yield func(jsonField) bool) {
	return func(yield func(jsonField) bool) {
		var walk func(reflect.Type) bool
		walk = func(typ reflect.Type) bool {
			for i := range typ.NumField() {
				f := typ.Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" || !f.IsExported() {
					continue
				}
				if name == "" && f.Anonymous {
					ft := f.Type
					for ft.Kind() == reflect.Pointer {
						ft = ft.Elem()
					}
					if ft.Kind() == reflect.Struct && !walk(ft) {
						return false
					}
					continue
				}
				if name == "" {
					name = f.Name
				}
				if !yield(jsonField{name, f.Type}) {
					return false
				}
			}
			return true
		}
		walk(typ)
	}
}

// setPath sets vals at the dotted path to v, creating maps on the way.
func setPath(vals map[string]any, path string, v any) {
	keys := strings.Split(path, ".")
	m := vals
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
}
