package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// kubeProxyFlagStatus says, for --help, what kpr does with each kube-proxy
// flag it takes that is not plainly honoured: mapped onto a kpr setting
// (with a difference the usage text states), or refused. The flags of
// kubeProxyOnlyFlags are "ignored"; every other kube-proxy flag is
// "honoured": kpr does what kube-proxy does with it.
var kubeProxyFlagStatus = map[string]string{
	"proxy-mode":               "mapped",
	"bind-address":             "mapped",
	"v":                        "mapped",
	"logging-format":           "mapped",
	"iptables-sync-period":     "mapped",
	"iptables-min-sync-period": "mapped",
	"ipvs-sync-period":         "mapped",
	"ipvs-min-sync-period":     "mapped",
	"write-config-to":          "refused",
}

func kubeProxyStatusOf(name string) string {
	if st, ok := kubeProxyFlagStatus[name]; ok {
		return st
	}
	if _, ok := kubeProxyOnlyFlags[name]; ok {
		return "ignored"
	}
	return "honoured"
}

// splitRunFlags parts the flags of `kpr run` into kpr's own and kube-proxy's
// (those of kubeProxyFlagNames, kpr's flags of the same names included:
// they stand for kube-proxy's), the latter's usage prefixed with what kpr
// does with them.
func splitRunFlags(all *pflag.FlagSet) (own, kubeProxy *pflag.FlagSet) {
	own, kubeProxy = pflag.NewFlagSet("kpr", pflag.ContinueOnError), pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	isKubeProxy := map[string]bool{}
	for _, n := range kubeProxyFlagNames {
		isKubeProxy[n] = true
	}
	all.VisitAll(func(fl *pflag.Flag) {
		if fl.Hidden {
			return
		}
		if !isKubeProxy[fl.Name] || fl.Name == "help" {
			own.AddFlag(fl)
			return
		}
		c := *fl
		c.Usage = "[" + kubeProxyStatusOf(fl.Name) + "] " + fl.Usage
		kubeProxy.AddFlag(&c)
	})
	return own, kubeProxy
}

// runUsage is `kpr run --help`'s flag listing: kpr's own flags first, then
// kube-proxy's under a heading of their own, each marked honoured, mapped,
// ignored or refused.
func runUsage(cmd *cobra.Command) error {
	own, kubeProxy := splitRunFlags(cmd.LocalFlags())
	var b strings.Builder
	fmt.Fprintf(&b, "Usage:\n  %s\n\nFlags:\n%s", cmd.UseLine(), own.FlagUsages())
	fmt.Fprintf(&b, "\nkube-proxy's flags, taken so that a kube-proxy DaemonSet's arguments start kpr unchanged (deploy/README.md):\n"+
		"  [honoured] as kube-proxy; [mapped] onto a kpr setting, with the difference stated; [ignored] named in a warning at start; [refused] an error\n%s",
		kubeProxy.FlagUsages())
	if inherited := cmd.InheritedFlags(); inherited.HasAvailableFlags() {
		fmt.Fprintf(&b, "\nGlobal Flags:\n%s", inherited.FlagUsages())
	}
	_, err := fmt.Fprint(cmd.OutOrStderr(), b.String())
	return err
}
