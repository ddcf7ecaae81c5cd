package webconfig

import (
	"bytes"
	"crypto/tls"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"golang.org/x/crypto/bcrypt"
	"sigs.k8s.io/yaml"
)

// LauncherUser is the basic-auth user ForLauncher adds for the launcher.
const LauncherUser = "pstrain-launcher"

// FileName is the name of the copy ForLauncher writes in its directory.
const FileName = "web-config.yml"

// Client authentication types under which a client must present a
// certificate (crypto/tls names, as the web config file spells them).
var certRequired = []string{"RequireAnyClientCert", "RequireAndVerifyClientCert"}

// File is what a client needs to know of a web configuration file.
type File struct {
	TLS   TLSServer         `json:"tls_server_config"`
	Users map[string]string `json:"basic_auth_users"` // user -> bcrypt hash
}

// TLSServer is the part of tls_server_config a client depends on.
type TLSServer struct {
	Cert       string `json:"cert"`
	CertFile   string `json:"cert_file"`
	Key        string `json:"key"`
	KeyFile    string `json:"key_file"`
	ClientCA   string `json:"client_ca"`
	ClientCAs  string `json:"client_ca_file"`
	ClientAuth string `json:"client_auth_type"`
}

// Enabled reports whether a server with this configuration serves TLS
// (the exporter toolkit's rule: any of these keys set).
func (t TLSServer) Enabled() bool {
	return t != TLSServer{}
}

// Read validates path as the exporter toolkit does (strictly, with its
// certificates and password hashes) and returns what a client needs of
// it, with relative file names resolved against path's directory.
func Read(path string) (File, error) {
	if err := web.Validate(path); err != nil {
		return File{}, fmt.Errorf("web config %s: %w", path, err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("web config: %w", err)
	}
	var f File
	if err := yaml.Unmarshal(raw, &f); err != nil {
		return File{}, fmt.Errorf("web config %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	f.TLS.CertFile = joinDir(dir, f.TLS.CertFile)
	f.TLS.KeyFile = joinDir(dir, f.TLS.KeyFile)
	f.TLS.ClientCAs = joinDir(dir, f.TLS.ClientCAs)
	return f, nil
}

// joinDir is name relative to dir, unless it is empty or absolute.
func joinDir(dir, name string) string {
	if name == "" || filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(dir, name)
}

// ForLauncher writes dir/FileName: the web config file src (validated)
// with its relative file names made absolute and, when src has users,
// LauncherUser added with a password drawn from rnd. It returns the
// copy's path, which the launcher passes to its tasks, and the Client
// that reaches a server using it.
func ForLauncher(src, dir string, rnd io.Reader) (string, *Client, error) {
	f, err := Read(src)
	if err != nil {
		return "", nil, err
	}
	if slices.Contains(certRequired, f.TLS.ClientAuth) {
		return "", nil, fmt.Errorf("web config %s: client_auth_type %s: the launcher's health checks of its tasks have no client certificate to present (use basic_auth_users to restrict the endpoint, or start the tasks yourself)", src, f.TLS.ClientAuth)
	}
	if _, ok := f.Users[LauncherUser]; ok {
		return "", nil, fmt.Errorf("web config %s: user %q is the launcher's own", src, LauncherUser)
	}
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", nil, fmt.Errorf("web config: %w", err)
	}
	doc := map[string]any{}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", nil, fmt.Errorf("web config %s: %w", src, err)
	}
	c := &Client{tls: f.TLS.Enabled(), cert: f.TLS.Cert, certFile: f.TLS.CertFile}
	if len(f.Users) > 0 {
		if c.user, c.password, err = addLauncherUser(doc, rnd); err != nil {
			return "", nil, err
		}
	}
	if ts, ok := doc["tls_server_config"].(map[string]any); ok {
		for k, v := range map[string]string{"cert_file": f.TLS.CertFile, "key_file": f.TLS.KeyFile, "client_ca_file": f.TLS.ClientCAs} {
			if v != "" {
				ts[k] = v
			}
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", nil, fmt.Errorf("web config: %w", err)
	}
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(path, out, 0o600); err != nil {
		return "", nil, fmt.Errorf("web config: %w", err)
	}
	if err := web.Validate(path); err != nil {
		return "", nil, fmt.Errorf("web config %s (written from %s): %w", path, src, err)
	}
	return path, c, nil
}

// addLauncherUser adds LauncherUser with a fresh password to doc's
// basic_auth_users and returns the credentials.
func addLauncherUser(doc map[string]any, rnd io.Reader) (user, password string, err error) {
	b := make([]byte, 24)
	if _, err := io.ReadFull(rnd, b); err != nil {
		return "", "", fmt.Errorf("web config: launcher password: %w", err)
	}
	password = hex.EncodeToString(b)
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return "", "", fmt.Errorf("web config: launcher password: %w", err)
	}
	users, ok := doc["basic_auth_users"].(map[string]any)
	if !ok {
		return "", "", errors.New("web config: basic_auth_users is not a map")
	}
	users[LauncherUser] = string(hash)
	return LauncherUser, password, nil
}

// Client reaches the endpoints of servers that use one web config file.
// A nil *Client reaches plain HTTP servers without credentials.
type Client struct {
	tls            bool
	cert, certFile string // the certificate the servers present (inline or file)
	user, password string // basic auth; "" = none
}

// URL is the URL of path on the server at hostport.
func (c *Client) URL(hostport, path string) string {
	if c != nil && c.tls {
		return "https://" + hostport + path
	}
	return "http://" + hostport + path
}

// Transport returns a new transport for requests to the servers: with
// the credentials and, under TLS, trusting exactly the servers'
// certificate. Close its idle connections when done.
func (c *Client) Transport() *Transport {
	base := &http.Transport{}
	if c != nil && c.tls {
		// The servers' names are loopback addresses their certificate
		// need not name: the chain and name checks are replaced by
		// pinning the certificate itself (verifyPinned).
		base.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, VerifyConnection: c.verifyPinned, MinVersion: tls.VersionTLS12} //nolint:gosec // pinned in VerifyConnection
	}
	t := &Transport{base: base}
	if c != nil {
		t.user, t.password = c.user, c.password
	}
	return t
}

// HTTP returns an *http.Client over a new Transport with the given
// timeout per request.
func (c *Client) HTTP(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: c.Transport()}
}

// verifyPinned accepts a server only if its certificate is the one the
// web config file names, read now (a renewed file is followed).
func (c *Client) verifyPinned(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("web config: the server presented no certificate")
	}
	data := []byte(c.cert)
	if c.certFile != "" {
		var err error
		if data, err = os.ReadFile(c.certFile); err != nil {
			return fmt.Errorf("web config: %w", err)
		}
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return errors.New("web config: no PEM certificate in cert_file")
	}
	if !bytes.Equal(block.Bytes, cs.PeerCertificates[0].Raw) {
		return errors.New("web config: the server's certificate is not the one of the web config file")
	}
	return nil
}

// Transport is an http.RoundTripper that adds basic-auth credentials.
type Transport struct {
	base           *http.Transport
	user, password string
}

// RoundTrip sends req (cloned, with the credentials when there are any).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.user != "" {
		req = req.Clone(req.Context())
		req.SetBasicAuth(t.user, t.password)
	}
	return t.base.RoundTrip(req)
}

// CloseIdleConnections closes the transport's idle connections.
func (t *Transport) CloseIdleConnections() { t.base.CloseIdleConnections() }
