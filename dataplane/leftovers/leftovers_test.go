package leftovers

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each mode's record is its own: removing one mode's state never reads
// another's record, and the names suit bpffs (no dots).
func TestRecordsOfModesAreApart(t *testing.T) {
	root := filepath.Join(t.TempDir(), "bpf")
	ipt, err := For(root, "", "iptables")
	if err != nil {
		t.Fatal(err)
	}
	ipvs, err := For(root, "", "ipvs")
	if err != nil {
		t.Fatal(err)
	}
	if ipt.Path() == ipvs.Path() || !strings.Contains(ipvs.Path(), "-ipvs-netns-") || strings.Contains(filepath.Base(ipvs.Path()), ".") {
		t.Errorf("records %s and %s: want distinct, each naming its mode, without dots", ipt.Path(), ipvs.Path())
	}
	if err := ipvs.Write(); err != nil {
		t.Fatal(err)
	}
	ran := false
	got, err := ipt.Remove("the chains", func() (int, error) { ran = true; return 1, nil })
	if err != nil || got.Found || ran {
		t.Errorf("the IPVS record was taken for the iptables mode's: %+v, %v, removal ran %v", got, err, ran)
	}
	if err := ipt.Check(); !errors.Is(err, ErrNotRecorded) {
		t.Errorf("Check without a record = %v, want ErrNotRecorded", err)
	}
}

// A failed removal keeps the record, so that the next cleanup tries again;
// a successful one removes it.
func TestRemoveKeepsTheRecordUntilItSucceeds(t *testing.T) {
	r, err := For(filepath.Join(t.TempDir(), "bpf"), "", "iptables")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("iptables-restore failed")
	got, err := r.Remove("the chains", func() (int, error) { return 2, failed })
	if !errors.Is(err, failed) || !got.Found || got.Count != 2 || !strings.Contains(err.Error(), r.Path()) {
		t.Errorf("failed removal = %+v, %v; want found, 2, the cause and the record named", got, err)
	}
	if _, err := os.Stat(r.Path()); err != nil {
		t.Fatalf("the record went with a failed removal: %v", err)
	}
	got, err = r.Remove("the chains", func() (int, error) { return 3, nil })
	if err != nil || got != (Removed{Found: true, Count: 3}) {
		t.Errorf("removal = %+v, %v; want found, 3", got, err)
	}
	if err := r.Check(); !errors.Is(err, ErrNotRecorded) {
		t.Errorf("the record stayed after the removal: %v", err)
	}
}

func TestRecordNeedsABPFRoot(t *testing.T) {
	if _, err := For("", "", "iptables"); err == nil {
		t.Error("For without a bpffs directory gave a record")
	}
}
