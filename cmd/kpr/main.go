package main

import (
	"fmt"
	"os"
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
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "json", "log format: json or console")
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

// logger builds the zap logger the flags ask for and routes client-go's
// klog output into it, so every line kpr prints is structured alike.
func (g *globalFlags) logger() (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(g.logLevel)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var cfg zap.Config
	switch g.logFormat {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		// The development config's readable lines, without its
		// development behaviour: a daemon's warnings carry no stack trace
		// (errors still do) and DPanic does not panic.
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", g.logFormat)
	}
	cfg.Level = zap.NewAtomicLevelAt(level)
	// The production config samples by message text: past 100 lines a
	// second with one message, it drops all but every 100th, however
	// their fields differ (one line per refused Service in a burst).
	cfg.Sampling = nil
	log, err := cfg.Build()
	if err != nil {
		return nil, err
	}
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
	return log, nil
}
