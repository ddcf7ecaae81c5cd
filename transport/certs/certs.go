// Package certs makes the certificates a pstrain cluster needs for mutual
// TLS: one ECDSA P-256 certificate authority and, per task, a certificate
// valid both as a server and as a client, with the task's host names and
// IP addresses as subject alternative names. Files are PEM, named after
// the task: ca.pem, ca-key.pem, chief-0.pem, chief-0-key.pem, ps-1.pem, ...
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"time"

	"github.com/pstrain/pstrain/cluster"
)

// File names inside a certificate directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// DefaultValidity is how long generated certificates are valid: a year,
// long enough for any training run, short enough that a leaked key expires.
const DefaultValidity = 365 * 24 * time.Hour

// clockSkew backdates NotBefore so a peer whose clock is slightly behind
// still accepts a fresh certificate.
const clockSkew = 5 * time.Minute

// TaskName is the base name of a task's files: "chief-0", "ps-1",
// "worker-3".
func TaskName(t cluster.Task) string {
	return fmt.Sprintf("%s-%d", t.Type, t.Index)
}

// CertFile is the task's certificate file name ("ps-1.pem").
func CertFile(t cluster.Task) string { return TaskName(t) + ".pem" }

// KeyFile is the task's private key file name ("ps-1-key.pem").
func KeyFile(t cluster.Task) string { return TaskName(t) + "-key.pem" }

// Authority is a certificate authority that can issue task certificates.
type Authority struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Options control issuing. The zero value means: now, DefaultValidity,
// crypto/rand.
type Options struct {
	// Now is the issuing time (default time.Now).
	Now func() time.Time
	// Validity is how long a certificate is valid (default DefaultValidity).
	Validity time.Duration
	// Rand is the source for serial numbers (default crypto/rand.Reader).
	// Keys always come from crypto/rand.
	Rand io.Reader
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o Options) validity() (time.Duration, error) {
	switch {
	case o.Validity == 0:
		return DefaultValidity, nil
	case o.Validity < time.Minute:
		return 0, fmt.Errorf("certs: validity %v is too short (want at least a minute)", o.Validity)
	}
	return o.Validity, nil
}

func (o Options) rand() io.Reader {
	if o.Rand != nil {
		return o.Rand
	}
	return rand.Reader
}

func (o Options) serial() (*big.Int, error) {
	n, err := rand.Int(o.rand(), new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never zero
}

// NewAuthority makes a self-signed CA named commonName.
func NewAuthority(commonName string, o Options) (*Authority, error) {
	validity, err := o.validity()
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	serial, err := o.serial()
	if err != nil {
		return nil, err
	}
	now := o.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"pstrain"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(o.rand(), tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	return &Authority{Cert: cert, Key: key}, nil
}

// keyID is a subject key identifier: a truncated SHA-256 of the public key.
func keyID(pub *ecdsa.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(der)
	return sum[:20]
}

// Issued is one task's certificate and key, PEM-encoded.
type Issued struct {
	CertPEM []byte
	KeyPEM  []byte
	Cert    *x509.Certificate
}

// Issue makes a certificate for commonName valid for hosts (DNS names or
// IP addresses) with both server and client authentication, so the same
// file serves a task's gRPC server and its outgoing connections.
func (a *Authority) Issue(commonName string, hosts []string, o Options) (*Issued, error) {
	if commonName == "" {
		return nil, errors.New("certs: empty common name")
	}
	validity, err := o.validity()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: []string{"pstrain"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		switch ip := net.ParseIP(h); {
		case ip != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		case validDNSName(h):
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		default:
			return nil, fmt.Errorf("certs: %s: %q is neither an IP address nor a host name", commonName, h)
		}
	}
	if len(tmpl.IPAddresses)+len(tmpl.DNSNames) == 0 {
		return nil, fmt.Errorf("certs: %s: no host names or addresses", commonName)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: %s key: %w", commonName, err)
	}
	if tmpl.SerialNumber, err = o.serial(); err != nil {
		return nil, err
	}
	now := o.now()
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(a.Cert.NotAfter) {
		tmpl.NotAfter = a.Cert.NotAfter // never outlive the CA
	}
	tmpl.SubjectKeyId = keyID(&key.PublicKey)
	der, err := x509.CreateCertificate(o.rand(), tmpl, a.Cert, &key.PublicKey, a.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: %s certificate: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: %s certificate: %w", commonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{CertPEM: encodeCert(der), KeyPEM: keyPEM, Cert: cert}, nil
}

// validDNSName accepts host names made of letters, digits, '-', '_' and
// '.' (and a leading "*." wildcard), which is all a cluster file can
// hold.
func validDNSName(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if !validLabel(label) {
			return false
		}
	}
	return true
}

// validLabel accepts one label of a host name: 1 to 63 host-name
// characters, neither first nor last a '-'.
func validLabel(label string) bool {
	if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
		return false
	}
	for _, c := range label {
		if !hostNameChar(c) {
			return false
		}
	}
	return true
}

// hostNameChar reports whether c may appear in a host name's label.
func hostNameChar(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// CertPEM is the CA certificate, PEM-encoded.
func (a *Authority) CertPEM() []byte { return encodeCert(a.Cert.Raw) }

// KeyPEM is the CA key, PEM-encoded (PKCS #8).
func (a *Authority) KeyPEM() ([]byte, error) { return encodeKey(a.Key) }

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("certs: encoding key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseAuthority reads a CA back from its PEM certificate and key, so more
// task certificates can be issued later.
func ParseAuthority(certPEM, keyPEM []byte) (*Authority, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("certs: CA certificate: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("certs: CA certificate is not a CA")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, errors.New("certs: CA key: no PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("certs: CA key is %T, want ECDSA", k)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("certs: CA key does not match the CA certificate")
	}
	return &Authority{Cert: cert, Key: key}, nil
}
