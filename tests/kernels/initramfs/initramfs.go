// Package initramfs writes the initramfs archives the project's qemu VMs
// boot from: the kernel-matrix VMs (tests/kernels/run) and the nodes of the
// real test cluster (tests/realcluster). Every kernel unpacks the
// uncompressed "newc" cpio format, so no compressor is needed on either side.
package initramfs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Create starts an archive at path. Write entries with the Writer's
// methods (the first error sticks and is returned by Close), then Close.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

// Close ends the archive and closes its file, and returns the first error
// of any write.
func (c *Writer) Close() error {
	c.trailer()
	if c.err == nil {
		c.err = c.w.Flush()
	}
	if err := c.f.Close(); c.err == nil {
		c.err = err
	}
	return c.err
}

// Writer writes the "newc" (070701) format: a hex header, the
// NUL-terminated name and the data, each padded to 4 bytes. Names are
// relative to the archive's root ("bin/sh", not "/bin/sh").
type Writer struct {
	f    *os.File
	w    *bufio.Writer
	ino  int
	err  error
	dirs map[string]bool
	// added are the paths Dynamic has written, files and symlinks.
	added map[string]bool
}

func (c *Writer) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	c.ino++
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	if c.err == nil {
		_, c.err = c.w.WriteString(name + "\x00")
	}
	c.pad(110 + len(name) + 1)
}

func (c *Writer) pad(n int) {
	if c.err == nil && n%4 != 0 {
		_, c.err = c.w.Write(make([]byte, 4-n%4))
	}
}

func (c *Writer) Dir(name string) {
	if c.dirs == nil {
		c.dirs = map[string]bool{}
	}
	c.dirs[name] = true
	c.header(name, 0o040755, 0)
}

func (c *Writer) Symlink(name, target string) {
	c.header(name, 0o120777, len(target))
	if c.err == nil {
		_, c.err = c.w.WriteString(target)
	}
	c.pad(len(target))
}

func (c *Writer) Data(name string, b []byte, perm uint32) {
	c.header(name, 0o100000|perm, len(b))
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
	c.pad(len(b))
}

func (c *Writer) File(name, src string, perm uint32) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = err
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.err = err
		return
	}
	c.header(name, 0o100000|perm, int(st.Size()))
	if c.err == nil {
		_, c.err = io.Copy(c.w, f)
	}
	c.pad(int(st.Size()))
}

// Busybox adds the static busybox at src as bin/busybox, with a symlink in
// bin for each of its applets but those named in shadowed (tools the
// archive carries in their real form).
func (c *Writer) Busybox(src string, shadowed map[string]bool) error {
	c.File("bin/busybox", src, 0o755)
	applets, err := exec.Command(src, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", src, err)
	}
	for _, a := range strings.Fields(string(applets)) {
		if !shadowed[a] && a != "busybox" {
			c.Symlink("bin/"+a, "busybox")
		}
	}
	return nil
}

func (c *Writer) trailer() { c.header("TRAILER!!!", 0, 0) }

// Dynamic adds a host executable (or shared object) and the shared
// libraries ldd names, each at its own path, so it runs in the VM as on the
// host. A path that is a symlink (iptables-nft to xtables-nft-multi) stays
// one, since multi-call binaries go by the name they were run as; each real
// file is added once.
func (c *Writer) Dynamic(bin string) error {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", bin, err)
	}
	files := []string{bin}
	for _, l := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(l) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	if c.added == nil {
		c.added = map[string]bool{}
	}
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			return err
		}
		for _, p := range []string{real, f} {
			if c.added[p] {
				continue
			}
			c.added[p] = true
			c.Parents(p)
			if p == real {
				c.File(strings.TrimPrefix(p, "/"), real, 0o755)
			} else {
				c.Symlink(strings.TrimPrefix(p, "/"), real)
			}
		}
	}
	return nil
}

// Parents adds the directories above path that are not in the archive yet.
func (c *Writer) Parents(path string) {
	if c.dirs == nil {
		c.dirs = map[string]bool{}
	}
	var chain []string
	for d := filepath.Dir(strings.TrimPrefix(path, "/")); d != "." && !c.dirs[d]; d = filepath.Dir(d) {
		chain = append(chain, d)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		c.dirs[chain[i]] = true
		c.Dir(chain[i])
	}
}

// xtablesDir is where Debian's iptables dlopens its matches and targets
// (-m comment, -j MARK, -j DNAT, ...) from.
const xtablesDir = "/usr/lib/x86_64-linux-gnu/xtables"

// XtablesPlugins are the host's iptables matches and targets. iptables
// loads them at run time, so ldd does not name them: an archive that
// carries iptables (Dynamic) needs them too, or every rule with a match
// fails with "Couldn't load match".
func XtablesPlugins() []string {
	plugins, _ := filepath.Glob(filepath.Join(xtablesDir, "*.so"))
	return plugins
}
