package netfilter

import (
	"slices"
	"testing"
)

// Rule lines split as iptables-restore reads them: quotes group and are
// dropped, a backslash escapes, blanks separate.
func TestSplitWords(t *testing.T) {
	for line, want := range map[string][]string{
		`-A KUBE-SVC-X -m comment --comment "ns/a:http -> 10.0.0.1:80" -j KUBE-SEP-Y`: {"-A", "KUBE-SVC-X", "-m", "comment", "--comment", "ns/a:http -> 10.0.0.1:80", "-j", "KUBE-SEP-Y"},
		`-A C  -j   RETURN`:                  {"-A", "C", "-j", "RETURN"},
		`-A C --comment ""`:                  {"-A", "C", "--comment", ""},
		`-A C --comment a" b"c`:              {"-A", "C", "--comment", "a bc"},
		`-A C --comment "say \"hi\"" -j ACC`: {"-A", "C", "--comment", `say "hi"`, "-j", "ACC"},
		`-A C --comment a\ b`:                {"-A", "C", "--comment", "a b"},
		"-A C\t-j\tDROP":                     {"-A", "C", "-j", "DROP"},
	} {
		got, err := SplitWords(line)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("SplitWords(%q) = %q, %v; want %q", line, got, err, want)
		}
	}
	if _, err := SplitWords(`-A C --comment "open`); err == nil {
		t.Error("an unterminated quote split without an error")
	}
}
