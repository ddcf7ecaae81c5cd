package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/certs"
	"github.com/pstrain/pstrain/transport/tlsconf"
)

// cmdCerts makes a CA and one certificate per task of a cluster file.
func cmdCerts(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("certs", "certs --out DIR [flags]", "Make a CA and a certificate per task of a cluster, for --tls-dir.")
	clusterFile := fs.String("cluster", "", "cluster file whose host names and IPs go into the certificates (default: the TF_CONFIG environment variable)")
	out := fs.String("out", "", "directory for ca.pem, ca-key.pem, <role>-<index>.pem / <role>-<index>-key.pem and the run's secret auth-token (created 0700)")
	validity := fs.Duration("validity", certs.DefaultValidity, "how long the certificates are valid")
	hosts := fs.String("hosts", "", "extra comma-separated host names or IPs for every task's certificate (e.g. a load balancer)")
	force := fs.Bool("force", false, "overwrite existing files in --out (makes a new CA: every task needs the new files)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *out == "" {
		return usagef("missing --out DIR")
	}
	spec, _, err := loadCluster(*clusterFile, os.Getenv("TF_CONFIG"))
	if err != nil {
		return err
	}
	var extra []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			extra = append(extra, h)
		}
	}
	written, err := certs.Generate(*out, spec, extra, certs.Options{Validity: *validity}, *force)
	if err != nil {
		return err
	}
	// The run's secret goes with the certificates: a task given --tls-dir
	// finds it there.
	tokenPath := filepath.Join(*out, auth.TokenFile)
	if *force || !exists(tokenPath) {
		t, err := auth.NewToken(nil)
		if err != nil {
			return err
		}
		if err := auth.WriteTokenFile(tokenPath, t); err != nil {
			return err
		}
		written = append(written, tokenPath)
	}
	for _, t := range spec.Tasks() {
		hs, _ := certs.TaskHosts(spec, t, extra)
		fmt.Fprintf(stdout, "%-12s %s  (%s)\n", certs.TaskName(t), filepath.Join(*out, certs.CertFile(t)), strings.Join(hs, ", "))
	}
	fmt.Fprintf(stdout, "wrote %d files to %s, valid for %v; keep ca-key.pem off the task machines\n", len(written), *out, *validity)
	return ctx.Err()
}

// tlsFlags are a task's TLS flags.
type tlsFlags struct {
	dir, cert, key, ca *string
	insecure           *bool
}

// bindTLSFlags registers --tls-dir, --tls-cert, --tls-key, --tls-ca and
// --insecure on fs.
func bindTLSFlags(fs *flag.FlagSet) *tlsFlags {
	return &tlsFlags{
		dir:      fs.String("tls-dir", "", "mutual TLS with the files pstrain certs made in this directory: ca.pem, <role>-<index>.pem, <role>-<index>-key.pem"),
		cert:     fs.String("tls-cert", "", "mutual TLS: this task's certificate (PEM)"),
		key:      fs.String("tls-key", "", "mutual TLS: this task's private key (PEM)"),
		ca:       fs.String("tls-ca", "", "mutual TLS: the CA certificate every task's certificate is checked against (PEM)"),
		insecure: fs.Bool("insecure", false, "allow plaintext gRPC on a cluster with non-loopback addresses (logs a warning)"),
	}
}

// load returns the task's TLS configuration, or nil for plaintext, which
// is refused on a cluster with non-loopback addresses unless --insecure.
func (f *tlsFlags) load(spec cluster.Spec, t cluster.Task, privacy config.Privacy, log *slog.Logger) (*tlsconf.Config, error) {
	files, ok, err := tlsconf.Resolve(*f.dir, tlsconf.Files{Cert: *f.cert, Key: *f.key, CA: *f.ca}, t)
	if err != nil {
		return nil, err
	}
	if !ok {
		if privacy == config.Integrity {
			return nil, usagef("--data-plane-privacy integrity needs mutual TLS (--tls-dir, or --tls-cert, --tls-key and --tls-ca): its MAC keys come from the TLS handshake")
		}
		warn, err := tlsconf.CheckPlaintext(spec, *f.insecure)
		if err != nil {
			return nil, err
		}
		if warn != "" {
			log.Warn(warn)
		}
		return nil, nil
	}
	c, err := tlsconf.Load(files)
	if err != nil {
		return nil, err
	}
	log.Info("mutual TLS", "cert", files.Cert, "ca", files.CA, "name", c.Name())
	return c, nil
}

// runTLSArgs prepares `pstrain run --tls-dir DIR`: certificates for every
// task of a local cluster (loopback names; the launcher picks the ports,
// which certificates do not name) are made in dir unless already there,
// and the returned flags pass dir on to every child.
func runTLSArgs(dir string, r config.Run, log *slog.Logger) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	spec := cluster.Spec{Chief: []string{"127.0.0.1:1"}}
	// Every slot (--max-ps, --max-workers) has its task's certificate: a
	// scale request starts its process later.
	ps, workers := r.PSSlots(), r.WorkerSlots()
	for i := 0; i < ps; i++ {
		spec.PS = append(spec.PS, fmt.Sprintf("127.0.0.1:%d", 100+i))
	}
	for i := 0; i < workers; i++ {
		spec.Worker = append(spec.Worker, fmt.Sprintf("127.0.0.1:%d", 100+ps+i))
	}
	for i := 0; i < r.StandbySlots(); i++ { // standby/N: a certificate of its own, like ps/N
		spec.Standby = append(spec.Standby, fmt.Sprintf("127.0.0.1:%d", 100+ps+workers+i))
	}
	written, err := certs.Ensure(abs, spec, nil, certs.Options{Validity: 30 * 24 * time.Hour})
	if err != nil {
		return nil, err
	}
	if len(written) > 0 {
		log.Info("made TLS certificates", "dir", abs, "files", len(written))
	}
	return []string{"--tls-dir=" + abs}, nil
}
