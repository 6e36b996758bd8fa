package helm

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kpr-io/kpr/tests/deploy"
)

// lintMessages runs `helm lint --strict` on the chart with vals and
// returns what it reports above info: warnings and errors.
func lintMessages(vals map[string]any) []string {
	lint := action.NewLint()
	lint.Strict, lint.KubeVersion, lint.Namespace = true, oldestKube, deploy.Namespace
	res := lint.Run([]string{deploy.ChartDir()}, vals)
	var out []string
	for _, m := range res.Messages {
		if m.Severity > support.InfoSev {
			out = append(out, m.Error())
		}
	}
	for _, err := range res.Errors {
		out = append(out, err.Error())
	}
	return out
}

// TestValuesSchemaRejectsMistakes lints the chart, as `helm lint
// --strict` does, with values an operator could get wrong: each must
// fail, naming what is wrong. values.schema.json has additionalProperties
// false at every level it describes, so a misspelt key fails as a wrong
// type does.
func TestValuesSchemaRejectsMistakes(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string // in the message
	}{
		{"misspelt value", map[string]any{"lbAlgoritm": "maglev"}, "lbAlgoritm"},
		{"misspelt nested value", map[string]any{"mapSizes": map[string]any{"service": 524288}}, "service"},
		{"misspelt config field", map[string]any{"config": map[string]any{"metricsBindAdress": "0.0.0.0:10249"}}, "metricsBindAdress"},
		{"misspelt monitoring value", map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enable": true}}}, "enable"},
		{"map size of the wrong type", map[string]any{"mapSizes": map[string]any{"services": "big"}}, "services"},
		{"devices not a list", map[string]any{"devices": "eth0"}, "devices"},
		{"unknown --external-ips", map[string]any{"externalIPs": "nodelocal"}, "externalIPs"},
		{"config field of the wrong type", map[string]any{"config": map[string]any{"clientConnection": map[string]any{"qps": "fast"}}}, "qps"},
		{"a duration that is none", map[string]any{"config": map[string]any{"iptables": map[string]any{"syncPeriod": "30 seconds"}}}, "syncPeriod"},
		{"extraArgs without --", map[string]any{"extraArgs": []any{"lb-algorithm=maglev"}}, "extraArgs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := lintMessages(tc.vals)
			if len(msgs) == 0 {
				t.Fatalf("helm lint --strict passes with %v", tc.vals)
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Errorf("helm lint --strict fails without naming %q:\n%s", tc.want, strings.Join(msgs, "\n"))
			}
		})
	}
}

// TestValuesSchemaConfigIsKubeProxys checks values.schema.json's config
// against the KubeProxyConfiguration type kpr decodes: a field the schema
// lacks would be refused in a pasted kube-proxy configuration, and one
// the type lacks is a misspelling the schema would let through. Levels
// the schema leaves open (no properties) are not compared.
func TestValuesSchemaConfigIsKubeProxys(t *testing.T) {
	schema := readSchema(t)
	config := dig(schema, "properties", "config")
	if config == nil {
		t.Fatal("values.schema.json has no properties.config")
	}
	compareSchema(t, "config", config, reflect.TypeFor[kubeproxyconfig.KubeProxyConfiguration]())
}

func compareSchema(t *testing.T, path string, schema map[string]any, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		typ = typ.Elem()
		if items := dig(schema, "items"); items != nil {
			schema = items
		}
	}
	props, _ := schema["properties"].(map[string]any)
	if props == nil || typ.Kind() != reflect.Struct {
		return
	}
	if schema["additionalProperties"] != false {
		t.Errorf("values.schema.json: %s has properties but lets others through (additionalProperties is not false)", path)
	}
	fields := map[string]reflect.Type{}
	for f := range jsonFields(typ) {
		fields[f.name] = f.typ
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		sub, ok := props[name].(map[string]any)
		if !ok {
			t.Errorf("values.schema.json: %s lacks %s.%s, a field of %s", path, path, name, typ)
			continue
		}
		compareSchema(t, path+"."+name, sub, fields[name])
	}
	for _, name := range slices.Sorted(maps.Keys(props)) {
		if _, ok := fields[name]; !ok {
			t.Errorf("values.schema.json: %s.%s is no field of %s", path, name, typ)
		}
	}
}

// readSchema returns the chart's values.schema.json.
func readSchema(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deploy.ChartDir(), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// dig returns the object at path in m, or nil.
func dig(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		next, ok := m[p].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// TestValuesYAMLIsDescribed checks that every key of values.yaml, to its
// leaves, has a place in values.schema.json: with additionalProperties
// false a key the schema misses would make the chart's own defaults fail,
// which TestChartLints finds too; this names the key.
func TestValuesYAMLIsDescribed(t *testing.T) {
	schema := readSchema(t)
	vals := valuesFile(t, filepath.Join(deploy.ChartDir(), "values.yaml"))
	var walk func(path string, v any, s map[string]any)
	walk = func(path string, v any, s map[string]any) {
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		props, _ := s["properties"].(map[string]any)
		for k, child := range m {
			sub, ok := props[k].(map[string]any)
			if !ok {
				if s["additionalProperties"] == false {
					t.Errorf("values.yaml's %s.%s is not in values.schema.json", path, k)
				}
				continue
			}
			walk(fmt.Sprintf("%s.%s", path, k), child, sub)
		}
	}
	walk("", map[string]any(vals), schema)
}
