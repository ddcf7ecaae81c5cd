package certs

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/cluster"
)

var testSpec = cluster.Spec{
	Chief:  []string{"chief.example:2222"},
	PS:     []string{"10.0.0.2:2222", "ps-1.pstrain.svc:2222"},
	Worker: []string{"10.0.0.4:2222"},
}

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGenerateChainsSANsAndPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	written, err := Generate(dir, testSpec, []string{"lb.example"}, Options{Now: func() time.Time { return now }, Validity: 48 * time.Hour}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 2+2*len(testSpec.Tasks()) {
		t.Fatalf("wrote %d files: %v", len(written), written)
	}
	ca := parseCert(t, filepath.Join(dir, CAFile))
	if !ca.IsCA || ca.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("CA: IsCA %v, key %v", ca.IsCA, ca.PublicKeyAlgorithm)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	want := map[string][]string{ // task -> a name the certificate must hold
		"chief-0":  {"chief.example", "localhost", "127.0.0.1", "lb.example"},
		"ps-0":     {"10.0.0.2", "::1"},
		"ps-1":     {"ps-1.pstrain.svc"},
		"worker-0": {"10.0.0.4"},
	}
	for _, task := range testSpec.Tasks() {
		c := parseCert(t, filepath.Join(dir, CertFile(task)))
		if c.Subject.CommonName != TaskName(task) {
			t.Errorf("%s: CN %q", task, c.Subject.CommonName)
		}
		for _, name := range want[TaskName(task)] {
			opts := x509.VerifyOptions{Roots: roots, DNSName: name, CurrentTime: now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			if _, err := c.Verify(opts); err != nil {
				t.Errorf("%s as server %s: %v", task, name, err)
			}
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s as client: %v", task, err)
		}
		// Another task's name must not verify (ps-0 is not worker-0's host).
		if TaskName(task) == "ps-0" {
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.0.0.4", CurrentTime: now}); err == nil {
				t.Errorf("ps-0 certificate valid for worker-0's address")
			}
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now.Add(49 * time.Hour)}); err == nil {
			t.Errorf("%s still valid after its validity", task)
		}
		for _, f := range []struct {
			name string
			perm os.FileMode
		}{{KeyFile(task), 0o600}, {CertFile(task), 0o644}} {
			st, err := os.Stat(filepath.Join(dir, f.name))
			if err != nil || st.Mode().Perm() != f.perm {
				t.Errorf("%s: mode %v, want %v (%v)", f.name, st.Mode().Perm(), f.perm, err)
			}
		}
	}
	if st, _ := os.Stat(filepath.Join(dir, CAKeyFile)); st.Mode().Perm() != 0o600 {
		t.Errorf("CA key mode %v", st.Mode().Perm())
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v", st.Mode().Perm())
	}
	// No temporary files left behind.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("left %s", e.Name())
		}
	}
	if _, err := Generate(dir, testSpec, nil, Options{}, false); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second Generate without overwrite: %v", err)
	}
	if _, err := Generate(dir, testSpec, nil, Options{}, true); err != nil {
		t.Errorf("overwrite: %v", err)
	}
}

func TestEnsureKeepsExistingAndIssuesMissingFromTheSameCA(t *testing.T) {
	dir := t.TempDir()
	small := cluster.Spec{Chief: []string{"127.0.0.1:1"}, PS: []string{"127.0.0.1:2"}, Worker: []string{"127.0.0.1:3"}}
	if w, err := Ensure(dir, small, nil, Options{}); err != nil || len(w) != 8 {
		t.Fatalf("first Ensure: %v %v", w, err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "ps-0.pem"))
	if w, err := Ensure(dir, small, nil, Options{}); err != nil || len(w) != 0 {
		t.Fatalf("complete dir rewritten: %v %v", w, err)
	}
	bigger := small
	bigger.Worker = append(bigger.Worker, "127.0.0.1:4")
	w, err := Ensure(dir, bigger, nil, Options{})
	if err != nil || len(w) != 2 || !slices.Contains(w, filepath.Join(dir, "worker-1.pem")) {
		t.Fatalf("Ensure with one more worker: %v %v", w, err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "ps-0.pem"))
	if string(before) != string(after) {
		t.Error("existing certificate replaced")
	}
	roots := x509.NewCertPool()
	roots.AddCert(parseCert(t, filepath.Join(dir, CAFile)))
	if _, err := parseCert(t, filepath.Join(dir, "worker-1.pem")).Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("new certificate does not chain to the old CA: %v", err)
	}
	// Task certificates without their CA cannot be completed.
	os.Remove(filepath.Join(dir, CAFile))
	if _, err := Ensure(dir, bigger, nil, Options{}); err == nil || !strings.Contains(err.Error(), "no ca.pem") {
		t.Errorf("missing CA: %v", err)
	}
}

func TestIssueRejectsBadInput(t *testing.T) {
	ca, err := NewAuthority("test", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		hosts []string
		o     Options
		want  string
	}{
		{"", []string{"a"}, Options{}, "empty common name"},
		{"x", nil, Options{}, "no host"},
		{"x", []string{"bad host!"}, Options{}, "neither"},
		{"x", []string{"-a.b"}, Options{}, "neither"},
		{"x", []string{"a"}, Options{Validity: time.Second}, "too short"},
	} {
		if _, err := ca.Issue(tc.name, tc.hosts, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Issue(%q, %v): %v, want %q", tc.name, tc.hosts, err, tc.want)
		}
	}
	// A certificate never outlives its CA.
	is, err := ca.Issue("x", []string{"127.0.0.1"}, Options{Validity: 10 * DefaultValidity})
	if err != nil || is.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %v beyond CA %v (%v)", is.Cert.NotAfter, ca.Cert.NotAfter, err)
	}
	if !slices.ContainsFunc(is.Cert.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.ParseIP("127.0.0.1")) }) {
		t.Errorf("IP SANs %v", is.Cert.IPAddresses)
	}
}

func TestParseAuthorityRoundTripAndMismatch(t *testing.T) {
	a, _ := NewAuthority("a", Options{})
	b, _ := NewAuthority("b", Options{})
	ka, _ := a.KeyPEM()
	kb, _ := b.KeyPEM()
	got, err := ParseAuthority(a.CertPEM(), ka)
	if err != nil || !got.Cert.Equal(a.Cert) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := ParseAuthority(a.CertPEM(), kb); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("mismatched key: %v", err)
	}
	if _, err := ParseAuthority([]byte("junk"), ka); err == nil {
		t.Error("junk certificate accepted")
	}
	leaf, _ := a.Issue("leaf", []string{"h"}, Options{})
	if _, err := ParseAuthority(leaf.CertPEM, leaf.KeyPEM); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("leaf as CA: %v", err)
	}
}
