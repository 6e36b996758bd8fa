package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// fakeServices is a serviceLister over names, recording the namespaces it
// was asked for.
func fakeServices(asked *[]string, names ...string) serviceLister {
	return func(_ context.Context, namespace string) ([]string, error) {
		*asked = append(*asked, namespace)
		var out []string
		for _, n := range names {
			if namespace == "" || strings.HasPrefix(n, namespace+"/") {
				out = append(out, n)
			}
		}
		return out, nil
	}
}

// Services complete as namespace/name, from one namespace once it is
// typed; with no API server, nothing is offered and no file names either.
func TestCompleteServices(t *testing.T) {
	var asked []string
	complete := completeServices(fakeServices(&asked, "default/kubernetes", "shop/cart", "shop/web", "shopping/list"))
	cmd := &cobra.Command{}
	for _, c := range []struct {
		typed     string
		want      []string
		namespace string
	}{
		{"", []string{"default/kubernetes", "shop/cart", "shop/web", "shopping/list"}, ""},
		{"sho", []string{"shop/cart", "shop/web", "shopping/list"}, ""},
		{"shop/", []string{"shop/cart", "shop/web"}, "shop"},
		{"shop/w", []string{"shop/web"}, "shop"},
		{"nosuch/", nil, "nosuch"},
	} {
		asked = nil
		got, directive := complete(cmd, nil, c.typed)
		if !slices.Equal(got, c.want) || directive != cobra.ShellCompDirectiveNoFileComp {
			t.Errorf("%q: %q, directive %d; want %q, no file completion", c.typed, got, directive, c.want)
		}
		if !slices.Equal(asked, []string{c.namespace}) {
			t.Errorf("%q: listed the namespaces %q, want %q", c.typed, asked, c.namespace)
		}
	}

	unreachable := completeServices(func(context.Context, string) ([]string, error) {
		return nil, errors.New("dial tcp 127.0.0.1:6443: connection refused")
	})
	if got, directive := unreachable(cmd, nil, "sh"); got != nil || directive != cobra.ShellCompDirectiveNoFileComp {
		t.Errorf("no API server: %q, directive %d; want nothing, no file completion", got, directive)
	}
}

// explain completes its one argument, trace its --service, with
// Services; and the listing they use reads the command's --kubeconfig.
func TestServiceCompletionIsWired(t *testing.T) {
	root := newRootCommand()
	explain, _, err := root.Find([]string{"explain"})
	if err != nil || explain.ValidArgsFunction == nil {
		t.Fatalf("kpr explain completes no argument (%v)", err)
	}
	if got, directive := explain.ValidArgsFunction(explain, []string{"shop/web"}, ""); got != nil || directive != cobra.ShellCompDirectiveNoFileComp {
		t.Errorf("explain's second argument completes to %q, directive %d; want nothing", got, directive)
	}
	trace, _, err := root.Find([]string{"trace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := trace.GetFlagCompletionFunc("service"); !ok {
		t.Error("kpr trace --service completes nothing")
	}
	// A kubeconfig that does not exist: the listing fails, quietly.
	if err := explain.Flags().Set("kubeconfig", t.TempDir()+"/nosuch"); err != nil {
		t.Fatal(err)
	}
	if got, directive := explain.ValidArgsFunction(explain, nil, "s"); got != nil || directive != cobra.ShellCompDirectiveNoFileComp {
		t.Errorf("with an unreadable kubeconfig: %q, directive %d; want nothing, no file completion", got, directive)
	}
}
