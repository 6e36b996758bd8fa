package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/zapr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"

	"github.com/kpr-io/kpr/dataplane/leftovers"
)

// globalFlags are shared by every subcommand.
type globalFlags struct {
	bpfRoot   string
	logLevel  string
	logFormat string
}

func main() {
	root := newRootCommand()
	root.SetArgs(kubeProxyArgs(os.Args[1:], root))
	cmd, err := root.ExecuteC()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kpr:", err)
	}
	os.Exit(exitCodeOf(cmd, err))
}

func newRootCommand() *cobra.Command { return newRootCommandFor(&globalFlags{}, &runFlags{}) }

// newRootCommandFor binds the flags to g and f, which tests read.
func newRootCommandFor(g *globalFlags, f *runFlags) *cobra.Command {
	root := &cobra.Command{
		Use:           "kpr",
		Short:         "kpr is a pure-eBPF replacement for kube-proxy",
		Long:          "kpr is a pure-eBPF replacement for kube-proxy." + rootExitCodesHelp(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// The default is the leftovers' root, not the eBPF loader's: every
	// mode records its writes under it (dataplane/leftovers).
	// kube-proxy's flags take _ for - (--proxy_mode), and so do kpr's.
	root.SetGlobalNormalizationFunc(wordSepNormalize)
	root.PersistentFlags().StringVar(&g.bpfRoot, "bpf-root", leftovers.DefaultRoot, "bpffs directory holding kpr's pinned maps and links")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: error, warn, info (klog's -v=0), debug (-v=4), "+
		"or a klog verbosity from 0 to 10, which shows the V(n) lines up to it; given, it wins over kube-proxy's -v and the config file's logging.verbosity")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", logFormatJSON, "log format: json, Kubernetes components' JSON lines "+
		"(ts in ms since the epoch, caller, msg, v for the verbosity, err, then the fields), or text, one readable line per entry "+
		"(console is the same); given, it wins over kube-proxy's --logging-format and the config file's logging.format")
	root.AddCommand(newRunCommand(g, f), newProbeCommand(), newCleanupCommand(g), newStatusCommand(g), newExplainCommand(g))
	for _, m := range modes {
		if m.commands != nil {
			root.AddCommand(m.commands(g)...)
		}
	}
	markUsageErrors(root)
	return root
}

// wordSepNormalize spells a flag name with - where it has _, as
// component-base's WordSepNormalizeFunc does for kube-proxy.
func wordSepNormalize(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

// logger builds the logger the flags ask for, writing to stderr.
func (g *globalFlags) logger() (*zap.Logger, error) {
	return g.loggerTo(zapcore.Lock(os.Stderr))
}

// loggerTo builds the logger the flags ask for, writing to w, and routes
// client-go's klog output into it, so every line kpr prints is structured
// alike and -v shows client-go's V(n) lines as kube-proxy's -v does.
func (g *globalFlags) loggerTo(w zapcore.WriteSyncer) (*zap.Logger, error) {
	level, err := parseLogLevel(g.logLevel)
	if err != nil {
		return nil, err
	}
	log, clientGo, err := newLoggers(w, g.logFormat, level)
	if err != nil {
		return nil, err
	}
	// klog drops a V(n) line before it reaches the logger unless its own
	// verbosity is n or more.
	var v klog.Level
	_ = v.Set(strconv.Itoa(verbosityOf(level)))
	klog.SetLogger(zapr.NewLogger(clientGo))
	return log, nil
}
