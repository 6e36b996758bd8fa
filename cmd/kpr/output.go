package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// outputFormat is the --output (-o) flag of the commands that print a
// report (status, probe, dump, explain): a form for people (table), or
// json or yaml for scripts. The YAML is the JSON converted, so both have
// the same fields under the same names, and a type's MarshalJSON shapes
// both. A value the command does not write fails as the flag is parsed,
// a usage error (exit 2).
type outputFormat struct {
	value string
	human string
}

// addOutputFlag registers --output on fl, human being the default and the
// name of the form for people.
func addOutputFlag(fl *pflag.FlagSet, human string) *outputFormat {
	o := &outputFormat{value: human, human: human}
	fl.VarP(o, "output", "o", fmt.Sprintf("output format: %s, json or yaml", human))
	return o
}

func (o *outputFormat) String() string { return o.value }
func (o *outputFormat) Type() string   { return "string" }

func (o *outputFormat) Set(s string) error {
	switch s {
	case o.human, "json", "yaml":
		o.value = s
		return nil
	}
	return fmt.Errorf("want %s, json or yaml", o.human)
}

// print writes v as JSON or YAML if the flag asks for one, or else has
// human write it for people.
func (o *outputFormat) print(w io.Writer, v any, human func(io.Writer) error) error {
	switch o.value {
	case "json":
		return writeJSON(w, v)
	case "yaml":
		return writeYAML(w, v)
	}
	return human(w)
}

// writeJSON is every command's -o json: v indented, one document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeYAML is -o yaml: v's JSON as one YAML document.
func writeYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
