package certs

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/atomicfile"
)

// LoopbackHosts are the names in every task's certificate, so tools and
// tests on the task's own machine can reach it as localhost.
func LoopbackHosts() []string { return []string{"localhost", "127.0.0.1", "::1"} }

// TaskHosts lists the names a task's certificate is valid for: the host of
// its address in the cluster, the loopback names, then extra.
func TaskHosts(spec cluster.Spec, t cluster.Task, extra []string) ([]string, error) {
	addr, err := spec.Addr(t)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("certs: %s address %q: %w", t, addr, err)
	}
	var out []string
	seen := map[string]bool{}
	for _, h := range append(append([]string{host}, LoopbackHosts()...), extra...) {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out, nil
}

// Generate makes a new CA in dir and a certificate for every task of spec
// (names from TaskHosts with extraHosts). Existing files are an error
// unless overwrite is set. It returns the paths written.
func Generate(dir string, spec cluster.Spec, extraHosts []string, o Options, overwrite bool) ([]string, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if !overwrite {
		names := []string{CAFile, CAKeyFile}
		for _, t := range spec.Tasks() {
			names = append(names, CertFile(t), KeyFile(t))
		}
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
				return nil, fmt.Errorf("certs: %s already exists (remove it, choose another directory, or overwrite with --force)", filepath.Join(dir, n))
			}
		}
	}
	ca, err := NewAuthority("pstrain CA", o)
	if err != nil {
		return nil, err
	}
	var written []string
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
		perm fs.FileMode
	}{{CAKeyFile, caKey, 0o600}, {CAFile, ca.CertPEM(), 0o644}} {
		p := filepath.Join(dir, f.name)
		if err := writeFile(p, f.data, f.perm); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	for _, t := range spec.Tasks() {
		ps, err := issueTask(dir, ca, spec, t, extraHosts, o)
		written = append(written, ps...)
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// Ensure makes sure dir holds a CA and a certificate for every task of
// spec: files already there are kept, a missing CA is created (only when
// no task certificate exists, since those would not chain to a new CA),
// and missing task certificates are issued by the CA. It returns the paths
// written (none when everything was there).
func Ensure(dir string, spec cluster.Spec, extraHosts []string, o Options) ([]string, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	caPath, caKeyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	var missing []cluster.Task
	for _, t := range spec.Tasks() {
		if !exists(filepath.Join(dir, CertFile(t))) || !exists(filepath.Join(dir, KeyFile(t))) {
			missing = append(missing, t)
		}
	}
	haveCA := exists(caPath)
	switch {
	case len(missing) == 0 && haveCA:
		return nil, nil
	case !haveCA && len(missing) == len(spec.Tasks()):
		return Generate(dir, spec, extraHosts, o, false)
	case !haveCA:
		return nil, fmt.Errorf("certs: %s has task certificates but no %s", dir, CAFile)
	}
	certPEM, err := os.ReadFile(caPath)
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	keyPEM, err := os.ReadFile(caKeyPath)
	if err != nil {
		return nil, fmt.Errorf("certs: cannot issue certificates for %s without the CA key: %w", missing[0], err)
	}
	ca, err := ParseAuthority(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	var written []string
	for _, t := range missing {
		ps, err := issueTask(dir, ca, spec, t, extraHosts, o)
		written = append(written, ps...)
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

func issueTask(dir string, ca *Authority, spec cluster.Spec, t cluster.Task, extraHosts []string, o Options) ([]string, error) {
	hosts, err := TaskHosts(spec, t, extraHosts)
	if err != nil {
		return nil, err
	}
	is, err := ca.Issue(TaskName(t), hosts, o)
	if err != nil {
		return nil, err
	}
	kp, cp := filepath.Join(dir, KeyFile(t)), filepath.Join(dir, CertFile(t))
	if err := writeFile(kp, is.KeyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(cp, is.CertPEM, 0o644); err != nil {
		return []string{kp}, err
	}
	return []string{kp, cp}, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// writeFile replaces path atomically with data and mode perm (a key is
// never readable by others, not even for a moment: atomicfile.Write).
func writeFile(path string, data []byte, perm fs.FileMode) error {
	if err := atomicfile.Write(path, data, perm, atomicfile.Options{Sync: true, ExactMode: true}); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
