package main

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/kpr-io/kpr/tests/kernels/initramfs"
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
	w, err := initramfs.Create(path)
	if err != nil {
		return err
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "run", "tmp", "root", "etc", "kpr", "kpr/tests", "kpr/modules"} {
		w.Dir(d)
	}
	w.File("init", p.init, 0o755)
	// A host tool wins over the busybox applet of its name: busybox's ip
	// has no `ip netns exec`, for one.
	shadowed := map[string]bool{}
	for _, tool := range p.tools {
		shadowed[filepath.Base(tool)] = true
	}
	if err := w.Busybox(p.busybox, shadowed); err != nil {
		return err
	}
	for _, tool := range p.tools {
		if err := w.Dynamic(tool); err != nil {
			return err
		}
	}
	w.File("kpr/kpr", p.kpr, 0o755)
	if len(p.kubeTools) > 0 {
		w.Dir("kpr/kube")
		// etcd's default cluster URLs name the loopback "localhost", and
		// the VM has no resolver to ask.
		w.Data("etc/hosts", []byte("127.0.0.1 localhost\n::1 localhost\n"), 0o644)
	}
	for _, t := range p.kubeTools {
		w.File("kpr/kube/"+filepath.Base(t), t, 0o755)
	}
	for _, t := range p.tests {
		w.File("kpr/tests/"+filepath.Base(t), t, 0o755)
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
			w.Parents("/" + name)
			w.File(name, path, 0o644)
			return nil
		})
		if err != nil {
			return fmt.Errorf("pack %s: %w", dir, err)
		}
	}
	w.Data("kpr/test-args", []byte(strings.Join(args, "\n")+"\n"), 0o644)
	w.File("kpr/modules.load", filepath.Join(kernelDir, "modules.load"), 0o644)
	mods, err := filepath.Glob(filepath.Join(kernelDir, "modules", "*.ko"))
	if err != nil {
		return err
	}
	for _, m := range mods {
		w.File("kpr/modules/"+filepath.Base(m), m, 0o644)
	}
	return w.Close()
}
