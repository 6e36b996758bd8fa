package main

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// packInitramfs writes an uncompressed newc cpio archive (every kernel
// unpacks those) with the layout tests/kernels/init expects:
//
//	/init                 the init
//	/bin/busybox, applets a shell and the tools tests exec (sleep)
//	/usr/sbin/bpftool...  host tools the tests exec (bpftool, ip, iptables,
//	                      conntrack), with their libraries and plugins
//	/kpr/kpr              kpr, for `kpr probe` and the CLI tests
//	/kpr/kube/            kube-apiserver and etcd, for the cluster suites,
//	/etc/hosts            and localhost for them
//	/kpr/tests/*.test     the test binaries
//	/kpr/src/<suite>/     each suite's directory, with its package's testdata
//	/kpr/test-args        their flags, one a line
//	/kpr/modules/*.ko     the kernel's modules, and modules.load
func packInitramfs(path, kernelDir string, p *payload, args []string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := &cpioWriter{w: bufio.NewWriterSize(f, 1<<20)}
	for _, d := range []string{"bin", "dev", "proc", "sys", "run", "tmp", "root", "etc", "kpr", "kpr/tests", "kpr/modules"} {
		w.dir(d)
	}
	w.file("init", p.init, 0o755)
	w.file("bin/busybox", p.busybox, 0o755)
	applets, err := exec.Command(p.busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", p.busybox, err)
	}
	// A host tool wins over the busybox applet of its name: busybox's ip
	// has no `ip netns exec`, for one.
	shadowed := map[string]bool{"busybox": true}
	for _, tool := range p.tools {
		shadowed[filepath.Base(tool)] = true
	}
	for _, a := range strings.Fields(string(applets)) {
		if !shadowed[a] {
			w.symlink("bin/"+a, "busybox")
		}
	}
	for _, tool := range p.tools {
		if err := w.dynamic(tool); err != nil {
			return err
		}
	}
	w.file("kpr/kpr", p.kpr, 0o755)
	if len(p.kubeTools) > 0 {
		w.dir("kpr/kube")
		// etcd's default cluster URLs name the loopback "localhost", and
		// the VM has no resolver to ask.
		w.data("etc/hosts", []byte("127.0.0.1 localhost\n::1 localhost\n"), 0o644)
	}
	for _, t := range p.kubeTools {
		w.file("kpr/kube/"+filepath.Base(t), t, 0o755)
	}
	for _, t := range p.tests {
		w.file("kpr/tests/"+filepath.Base(t), t, 0o755)
	}
	// Each suite runs in /kpr/src/<suite>, as `go test` runs it in its
	// package directory, with the package's testdata below it.
	for suite, dir := range p.testdata {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(filepath.Dir(dir), path)
			if err != nil {
				return err
			}
			name := filepath.Join("kpr/src", suite, rel)
			w.parents("/" + name)
			w.file(name, path, 0o644)
			return nil
		})
		if err != nil {
			return fmt.Errorf("pack %s: %w", dir, err)
		}
	}
	w.data("kpr/test-args", []byte(strings.Join(args, "\n")+"\n"), 0o644)
	w.file("kpr/modules.load", filepath.Join(kernelDir, "modules.load"), 0o644)
	mods, err := filepath.Glob(filepath.Join(kernelDir, "modules", "*.ko"))
	if err != nil {
		return err
	}
	for _, m := range mods {
		w.file("kpr/modules/"+filepath.Base(m), m, 0o644)
	}
	w.trailer()
	if w.err == nil {
		w.err = w.w.Flush()
	}
	if err := f.Close(); w.err == nil {
		w.err = err
	}
	return w.err
}

// cpioWriter writes the "newc" (070701) format: a hex header, the
// NUL-terminated name and the data, each padded to 4 bytes.
type cpioWriter struct {
	w    *bufio.Writer
	ino  int
	err  error
	dirs map[string]bool
	// added are the paths dynamic has written, files and symlinks.
	added map[string]bool
}

func (c *cpioWriter) header(name string, mode uint32, size int) {
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

func (c *cpioWriter) pad(n int) {
	if c.err == nil && n%4 != 0 {
		_, c.err = c.w.Write(make([]byte, 4-n%4))
	}
}

func (c *cpioWriter) dir(name string) {
	if c.dirs == nil {
		c.dirs = map[string]bool{}
	}
	c.dirs[name] = true
	c.header(name, 0o040755, 0)
}

func (c *cpioWriter) symlink(name, target string) {
	c.header(name, 0o120777, len(target))
	if c.err == nil {
		_, c.err = c.w.WriteString(target)
	}
	c.pad(len(target))
}

func (c *cpioWriter) data(name string, b []byte, perm uint32) {
	c.header(name, 0o100000|perm, len(b))
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
	c.pad(len(b))
}

func (c *cpioWriter) file(name, src string, perm uint32) {
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

func (c *cpioWriter) trailer() { c.header("TRAILER!!!", 0, 0) }

// dynamic adds a host executable (or shared object) and the shared
// libraries ldd names, each at its own path, so it runs in the VM as on the
// host. A path that is a symlink (iptables-nft to xtables-nft-multi) stays
// one, since multi-call binaries go by the name they were run as; each real
// file is added once.
func (c *cpioWriter) dynamic(bin string) error {
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
			c.parents(p)
			if p == real {
				c.file(strings.TrimPrefix(p, "/"), real, 0o755)
			} else {
				c.symlink(strings.TrimPrefix(p, "/"), real)
			}
		}
	}
	return nil
}

// parents adds the directories above path that are not in the archive yet.
func (c *cpioWriter) parents(path string) {
	if c.dirs == nil {
		c.dirs = map[string]bool{}
	}
	var chain []string
	for d := filepath.Dir(strings.TrimPrefix(path, "/")); d != "." && !c.dirs[d]; d = filepath.Dir(d) {
		chain = append(chain, d)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		c.dirs[chain[i]] = true
		c.dir(chain[i])
	}
}
