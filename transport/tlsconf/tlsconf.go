// Package tlsconf loads a task's mutual-TLS material (its certificate and
// key, and the cluster's CA) and turns it into gRPC transport credentials:
// servers require a client certificate signed by the CA, clients verify
// the server's certificate against the same CA. See docs/security.md.
package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/transport/certs"
)

// Files names a task's TLS files.
type Files struct {
	Cert string // the task's certificate (PEM)
	Key  string // its private key (PEM)
	CA   string // the CA certificate that signs every task (PEM)
}

// InDir is where `pstrain certs` puts task t's files in dir.
func InDir(dir string, t cluster.Task) Files {
	return Files{
		Cert: filepath.Join(dir, certs.CertFile(t)),
		Key:  filepath.Join(dir, certs.KeyFile(t)),
		CA:   filepath.Join(dir, certs.CAFile),
	}
}

// Resolve combines --tls-dir with --tls-cert, --tls-key and --tls-ca: the
// explicit files win, dir fills the rest. ok is false when TLS is off (no
// flag given). Giving only some of the three files without dir is an
// error.
func Resolve(dir string, explicit Files, t cluster.Task) (f Files, ok bool, err error) {
	if dir == "" && explicit == (Files{}) {
		return Files{}, false, nil
	}
	f = explicit
	if dir != "" {
		d := InDir(dir, t)
		if f.Cert == "" {
			f.Cert = d.Cert
		}
		if f.Key == "" {
			f.Key = d.Key
		}
		if f.CA == "" {
			f.CA = d.CA
		}
	}
	var missing []string
	for _, m := range []struct{ name, v string }{{"--tls-cert", f.Cert}, {"--tls-key", f.Key}, {"--tls-ca", f.CA}} {
		if m.v == "" {
			missing = append(missing, m.name)
		}
	}
	if len(missing) > 0 {
		return Files{}, false, fmt.Errorf("tls: %s missing: pass all of --tls-cert, --tls-key and --tls-ca, or --tls-dir", strings.Join(missing, ", "))
	}
	return f, true, nil
}

// Config is a loaded, checked set of TLS material for one task.
type Config struct {
	cert tls.Certificate
	pool *x509.CertPool
	leaf *x509.Certificate
}

// Load reads and checks f: the key must match the certificate, and the
// certificate must chain to the CA, so a file from another cluster is
// caught at start-up rather than at the first connection.
func Load(f Files) (*Config, error) {
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("tls: loading %s and %s: %w", f.Cert, f.Key, err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("tls: CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tls: CA %s holds no PEM certificate", f.CA)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", f.Cert, err)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	opts := x509.VerifyOptions{Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if _, err := leaf.Verify(opts); err != nil {
		return nil, fmt.Errorf("tls: %s is not valid under the CA %s (certificates from another cluster or expired?): %w", f.Cert, f.CA, err)
	}
	return &Config{cert: cert, pool: pool, leaf: leaf}, nil
}

// Name is the certificate's common name (e.g. "ps-0").
func (c *Config) Name() string { return c.leaf.Subject.CommonName }

// ServerTLS is the server side: TLS 1.3, the task's certificate, and a
// client certificate signed by the CA required.
func (c *Config) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    c.pool,
	}
}

// ClientTLS is the client side: TLS 1.3, the task's certificate as client
// certificate, and the server verified against the CA. The server name
// is the host of the address dialled (gRPC sets it).
func (c *Config) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cert},
		RootCAs:      c.pool,
	}
}

// ClientCredentials are gRPC credentials for dialling other tasks.
func (c *Config) ClientCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(c.ClientTLS())
}

// IsLoopbackHost reports whether host is "localhost" or a loopback IP.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckPlaintext decides whether a task may run without TLS on a cluster
// with these addresses: only when every address is loopback, or when
// insecure is set (then warn is the message to log).
func CheckPlaintext(spec cluster.Spec, insecure bool) (warn string, err error) {
	for _, t := range spec.Tasks() {
		addr, _ := spec.Addr(t)
		host, _, _ := net.SplitHostPort(addr)
		if IsLoopbackHost(host) {
			continue
		}
		if !insecure {
			return "", fmt.Errorf("%s address %s is not loopback: pass --tls-dir (or --tls-cert, --tls-key and --tls-ca) for mutual TLS, or --insecure to send parameters and gradients in plaintext", t, addr)
		}
		return fmt.Sprintf("--insecure: plaintext gRPC on a non-loopback network (%s at %s); anyone who can reach these ports can read and change the model", t, addr), nil
	}
	return "", nil
}

// IsTLSError reports whether a gRPC error is a failed TLS handshake (gRPC
// reports those as Unavailable with the handshake error in the message).
func IsTLSError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	for _, m := range []string{"authentication handshake failed", "tls: ", "x509: ", "first record does not look like a TLS handshake"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// Describe is err's message with gRPC's status framing removed, for
// errors that name the peer themselves.
func Describe(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// SpeaksTLS reports whether the server at addr answers a TLS handshake:
// it sends a ClientHello and reports true if a ServerHello comes back
// (whatever the handshake's fate later: this client has no certificate).
// A plaintext client uses it to tell "the server requires TLS" from "the
// server is not up yet".
func SpeaksTLS(ctx context.Context, addr string, timeout time.Duration) bool {
	d := net.Dialer{Timeout: timeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(timeout))
	var sawServer bool
	c := tls.Client(raw, &tls.Config{
		InsecureSkipVerify: true, // a probe: only whether TLS answers
		VerifyConnection: func(tls.ConnectionState) error {
			sawServer = true
			return errors.New("probe done")
		},
		MinVersion: tls.VersionTLS12,
	})
	err = c.HandshakeContext(ctx)
	return sawServer || (err != nil && strings.Contains(err.Error(), "certificate required"))
}

// IsPlaintextToTLS reports whether a plaintext gRPC client's error may
// mean the server speaks TLS: the server closes the connection at the
// first bytes, which gRPC reports as a broken preface or a reset.
func IsPlaintextToTLS(err error) bool {
	if status.Code(err) != codes.Unavailable {
		return false
	}
	msg := status.Convert(err).Message()
	for _, m := range []string{"server preface", "connection reset", "EOF", "frame too large", "http2"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}
