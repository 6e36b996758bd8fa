package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/apiclient"
)

// Shell completion of Services, for `kpr explain <namespace/name>` and
// `kpr trace --service`: the names come from the API server that the
// command's own flags (--kubeconfig) point at, as the command itself
// would read the Service.

// completionTimeout bounds the API call of a completion: a shell waits
// for it on every Tab.
const completionTimeout = 3 * time.Second

// serviceLister lists the Services of namespace, or of every namespace
// when it is empty, as namespace/name.
type serviceLister func(ctx context.Context, namespace string) ([]string, error)

// serviceLister lists Services through the API connection of f's flags,
// read when it is called: cobra parses the command line before it asks
// for completions.
func (f *runFlags) serviceLister() serviceLister {
	return func(ctx context.Context, namespace string) ([]string, error) {
		client, err := apiclient.New(f.apiConnection())
		if err != nil {
			return nil, err
		}
		var list v1.ServiceList
		if err := client.Core.Get().Namespace(namespace).Resource("services").Do(ctx).Into(&list); err != nil {
			return nil, err
		}
		names := make([]string, len(list.Items))
		for i, svc := range list.Items {
			names[i] = svc.Namespace + "/" + svc.Name
		}
		return names, nil
	}
}

// completeServices completes a namespace/name from list: once the
// namespace is typed, from its Services alone. Where the API server
// cannot be reached it offers nothing, quietly, and no file names
// either: a completion has nowhere to show an error.
func completeServices(list serviceLister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		namespace, _, typed := strings.Cut(toComplete, "/")
		if !typed {
			namespace = ""
		}
		ctx, cancel := context.WithTimeout(contextOf(cmd), completionTimeout)
		defer cancel()
		names, err := list(ctx, namespace)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, n := range names {
			if strings.HasPrefix(n, toComplete) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeFirstArg completes the first argument with complete, and no
// other: the commands using it take one.
func completeFirstArg(complete cobra.CompletionFunc) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return complete(cmd, args, toComplete)
	}
}

// contextOf is cmd's context; a command a test calls directly has none.
func contextOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
