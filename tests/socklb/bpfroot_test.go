package socklb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// nobody owns the pin directories the tests plant as an unprivileged user.
const nobody = 65534

// TestLoadRefusesUntrustedBPFRoot pre-creates the --bpf-root directory (or
// its links/ subdirectory, or an entry in it) the way a user other than root
// could on a world-writable bpffs, and checks that Load refuses to adopt it
// with an error saying what to fix, before pinning anything. A directory
// created by root with a safe mode is accepted.
func TestLoadRefusesUntrustedBPFRoot(t *testing.T) {
	harness.RequireRoot(t)
	// A fresh machine has no bpffs at /sys/fs/bpf until a Load mounts
	// one, as kpr does; the planted directories need it first.
	mounted := "/sys/fs/bpf/kpr-test-" + randomHex(6)
	if err := loader.EnsureBPFFS(mounted); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(mounted); err != nil {
		t.Fatal(err)
	}
	cg, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		plant   func(t *testing.T, root string)
		wantErr []string // empty: Load must accept the directory
	}{
		{
			name:    "world-writable root",
			plant:   func(t *testing.T, root string) { mkdirMode(t, root, 0o777, 0) },
			wantErr: []string{"mode 0777", "lets group or others write it", "chmod go-w", "rm -r"},
		},
		{
			name:    "group-writable root",
			plant:   func(t *testing.T, root string) { mkdirMode(t, root, 0o770, 0) },
			wantErr: []string{"mode 0770", "chmod go-w"},
		},
		{
			name:    "root owned by another user",
			plant:   func(t *testing.T, root string) { mkdirMode(t, root, 0o700, nobody) },
			wantErr: []string{"owned by uid 65534, not root", "chown -R root:root", "rm -r"},
		},
		{
			name: "world-writable links dir",
			plant: func(t *testing.T, root string) {
				mkdirMode(t, root, 0o700, 0)
				mkdirMode(t, filepath.Join(root, "links"), 0o777, 0)
			},
			wantErr: []string{"/links:", "mode 0777", "chmod go-w"},
		},
		{
			name: "entry owned by another user",
			plant: func(t *testing.T, root string) {
				mkdirMode(t, root, 0o700, 0)
				mkdirMode(t, filepath.Join(root, "links"), 0o700, 0)
				mkdirMode(t, filepath.Join(root, "links", "planted"), 0o700, nobody)
			},
			wantErr: []string{"planted, owned by uid 65534", "rm -r"},
		},
		{
			name:  "root-owned 0750 root",
			plant: func(t *testing.T, root string) { mkdirMode(t, root, 0o750, 0) },
		},
		{
			name:  "created by kpr",
			plant: func(t *testing.T, root string) {},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := "/sys/fs/bpf/kpr-test-" + randomHex(6)
			t.Cleanup(func() {
				// A refused directory holds only what the test planted
				// (which loader.Cleanup would not take for pins).
				if len(tc.wantErr) == 0 {
					if err := loader.Cleanup(root); err != nil {
						t.Errorf("cleanup of %s: %v", root, err)
					}
				}
				if err := os.RemoveAll(root); err != nil {
					t.Errorf("remove %s: %v", root, err)
				}
			})
			tc.plant(t, root)

			loaded, err := loader.Load(loader.Options{BPFRoot: root, CgroupRoot: cg.Path})
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load refused a pin directory root created safely: %v", err)
				}
				loaded.Close()
				for _, d := range []string{root, filepath.Join(root, "links")} {
					st, err := os.Stat(d)
					if err != nil {
						t.Fatal(err)
					}
					if st.Mode().Perm()&0o022 != 0 {
						t.Errorf("%s has mode %v, want no group or other write", d, st.Mode().Perm())
					}
				}
				return
			}
			if err == nil {
				loaded.Close()
				_ = loader.Cleanup(root) // detach what it attached
				t.Fatalf("Load adopted the planted pin directory %s", root)
			}
			for _, want := range append([]string{"refusing", root}, tc.wantErr...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Load error %q does not mention %q", err, want)
				}
			}
			// Nothing may have been pinned into the refused directory.
			entries, _ := filepath.Glob(filepath.Join(root, "kpr_*"))
			if len(entries) > 0 {
				t.Errorf("Load pinned %v into the refused directory", entries)
			}
		})
	}
}

// mkdirMode creates dir with exactly mode (the umask would mask it) owned by
// uid.
func mkdirMode(t *testing.T, dir string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
}
