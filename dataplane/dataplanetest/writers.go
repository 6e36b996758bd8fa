package dataplanetest

import (
	"reflect"
	"sort"
	"testing"
)

// CheckWriters holds a backend's account of where it writes against the
// tables it declares to the suite, so that a new way of writing cannot
// escape the per-Service refusal that the table walk checks.
//
// members are the parts of the backend's write path that reflection finds
// (the fields of its options, the methods of its kernel interface), and
// kind names them in messages. writes says, for every member, which
// declared tables it adds to: nil for a member that adds to none (it only
// reads, changes or removes, or what it adds to is checked elsewhere,
// which its entry's comment says). A member missing from writes, a table
// writes names that is not declared, and an entry of writes for a member
// that no longer exists all fail t.
func CheckWriters(t testing.TB, declared []Table, kind string, members []string, writes map[string][]string) {
	t.Helper()
	tables := map[string]bool{}
	for _, tb := range declared {
		tables[tb.Name] = true
	}
	present := map[string]bool{}
	for _, m := range members {
		present[m] = true
		adds, ok := writes[m]
		if !ok {
			t.Errorf("%s.%s is new: say which tables it adds to (nil for none), and declare them to the conformance suite", kind, m)
		}
		for _, tb := range adds {
			if !tables[tb] {
				t.Errorf("%s.%s adds to %s, which is not a table of the conformance suite", kind, m, tb)
			}
		}
	}
	var gone []string
	for m := range writes {
		if !present[m] {
			gone = append(gone, m)
		}
	}
	sort.Strings(gone)
	for _, m := range gone {
		t.Errorf("the list of writers names %s.%s, which no longer exists", kind, m)
	}
}

// MemberNames lists what CheckWriters takes as members: the fields of a
// struct type, or the methods of an interface type.
func MemberNames(typ reflect.Type) []string {
	var out []string
	if typ.Kind() == reflect.Interface {
		for i := range typ.NumMethod() {
			out = append(out, typ.Method(i).Name)
		}
		return out
	}
	for i := range typ.NumField() {
		out = append(out, typ.Field(i).Name)
	}
	return out
}
