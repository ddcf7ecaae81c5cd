package dataplane

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/pstrain/pstrain/transport/aesgcm"
)

// The TCP plane under TLS (docs/security.md, docs/wire.md): a TCP
// connection does the mutual TLS 1.3 handshake, so both ends are
// authenticated by certificates of the cluster's CA, and then leaves
// TLS for records of its own (records.go), keyed from the handshake
// with ExportKeyingMaterial, one key per direction, the record's
// sequence number its nonce. Two modes, named in ALPN so that ends that
// run different modes fail the handshake ("no application protocol")
// and neither can be downgraded to the other:
//
//   - encrypt (protoSealed, the default): each record is AES-128-GCM
//     sealed, as TLS 1.3 seals its records (TLS_AES_128_GCM_SHA256 is
//     what crypto/tls negotiates with AES-NI), but sealed straight into
//     the write buffer and opened in place in the reader's buffer, and
//     a large write's records sealed in parallel.
//   - integrity (protoIntegrity, --data-plane-privacy integrity): each
//     record travels in the clear with an AES-256-GMAC tag (AES-GCM
//     over no plaintext, the record as additional data).
//
// The switch from TLS to records: the client sends nothing after its
// handshake until it has read the server's confirmation, recordsConfirm,
// in one TLS record; the server sends nothing after it until a request
// comes, and sends no session tickets. So when each side leaves TLS no
// TLS byte is in flight or buffered, and the first raw byte each reads
// is a record's.
//
// Why GMAC for integrity: with AES-NI and carry-less multiply (amd64,
// arm64) it tags several GB/s per core, over four times HMAC-SHA256 with
// the SHA extensions and faster than AES-GCM encrypting, with vector AES
// (transport/aesgcm) or without (BenchmarkTag in integrity_test.go).

// ALPN names of the TCP plane's two privacy modes under TLS.
const (
	protoSealed    = "pstrain-data/gcm"
	protoIntegrity = "pstrain-data/mac"
)

const (
	// macLabel and sealLabel are the exporter labels the two modes'
	// keys are derived with.
	macLabel  = "EXPORTER-pstrain-data-integrity-v1"
	sealLabel = "EXPORTER-pstrain-data-gcm-v1"
	macKeyLen = 32 // AES-256, integrity
	// sealKeyLen is the encrypt mode's key: AES-128, the cipher TLS 1.3
	// negotiated for the data plane before it had its own records.
	sealKeyLen = 16
)

// recordsConfirm is the server's confirmation, its last bytes over TLS.
var recordsConfirm = [4]byte{'P', 'S', 'I', '1'}

// WithPrivacy returns a copy of a data-plane TLS configuration (client
// or server) that runs the integrity-only mode, or, with integrity
// false, the encrypt mode; both name their mode in ALPN, so ends that
// disagree fail the handshake instead of misreading each other.
func WithPrivacy(cfg *tls.Config, integrity bool) *tls.Config {
	if cfg == nil {
		return nil
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{protoSealed}
	if integrity {
		cfg.NextProtos = []string{protoIntegrity}
	}
	cfg.SessionTicketsDisabled = true // no post-handshake messages
	cfg.MinVersion = tls.VersionTLS13 // the exporter of TLS 1.3
	return cfg
}

// privacyOf is cfg as the data plane runs it: a configuration that
// names no mode (not made by WithPrivacy) runs the encrypt mode.
func privacyOf(cfg *tls.Config) *tls.Config {
	return WithPrivacy(cfg, wantsIntegrity(cfg))
}

// wantsIntegrity reports whether cfg runs the integrity-only mode.
func wantsIntegrity(cfg *tls.Config) bool {
	return cfg != nil && len(cfg.NextProtos) == 1 && cfg.NextProtos[0] == protoIntegrity
}

// explainHandshake adds the likely cause to a handshake error from ends
// whose modes differ.
func explainHandshake(err error) error {
	if err != nil && (strings.Contains(err.Error(), "no application protocol") ||
		strings.Contains(err.Error(), "unsupported application protocols")) {
		return fmt.Errorf("%w (the two ends run different --data-plane-privacy modes, or builds of pstrain whose data planes differ)", err)
	}
	return err
}

// recordKeys are one end's keys, for what it sends and what it receives.
type recordKeys struct {
	sealed     bool   // encrypt mode: records sealed, else tagged
	send, recv []byte // AES keys
}

// keysOf derives the keys of the mode want (an ALPN name) from a
// finished handshake, which must have negotiated it, and be a full
// TLS 1.3 handshake: the configurations ask for both (WithPrivacy), and
// keysOf refuses a connection that is not, whatever its configuration
// said (TLS 1.2's exporter, or a resumed session's keys, are not what
// docs/security.md describes).
func keysOf(cs tls.ConnectionState, want string, client bool) (recordKeys, error) {
	if cs.Version != tls.VersionTLS13 || cs.DidResume {
		return recordKeys{}, fmt.Errorf("records need a full TLS 1.3 handshake, this one was %s (resumed %t)", tls.VersionName(cs.Version), cs.DidResume)
	}
	if cs.NegotiatedProtocol != want {
		return recordKeys{}, fmt.Errorf("the other end does not run this --data-plane-privacy mode (ALPN %q, want %q)", cs.NegotiatedProtocol, want)
	}
	label, n := macLabel, macKeyLen
	if want == protoSealed {
		label, n = sealLabel, sealKeyLen
	}
	km, err := cs.ExportKeyingMaterial(label, nil, 2*n)
	if err != nil {
		return recordKeys{}, err
	}
	k := recordKeys{sealed: want == protoSealed, send: km[:n], recv: km[n:]} // client to server first
	if !client {
		k.send, k.recv = k.recv, k.send
	}
	return k, nil
}

// newGCM is AES-GCM under key (16 or 32 bytes): transport/aesgcm's
// where this CPU has vector AES (which hands AES-256 messages with text
// to crypto/cipher), crypto/cipher's otherwise. Both produce the same
// bytes, so two ends may use either.
func newGCM(key []byte) (cipher.AEAD, error) {
	if a, ok := aesgcm.New(key); ok {
		return a, nil
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// wantProto is the ALPN name of cfg's mode.
func wantProto(cfg *tls.Config) string {
	if wantsIntegrity(cfg) {
		return protoIntegrity
	}
	return protoSealed
}

// clientRecords finishes a client's switch to records on tc, whose
// handshake under cfg is done over rc: it waits for the server's
// confirmation (within ctx) and returns the record connection.
func clientRecords(ctx context.Context, tc *tls.Conn, rc *recordConn, cfg *tls.Config) (net.Conn, error) {
	keys, err := keysOf(tc.ConnectionState(), wantProto(cfg), true)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(handshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	tc.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { tc.SetReadDeadline(time.Unix(1, 0)) })
	var m [4]byte
	_, err = io.ReadFull(tc, m[:])
	stop()
	tc.SetReadDeadline(time.Time{})
	switch {
	case err != nil:
		return nil, fmt.Errorf("waiting for the server's confirmation of records: %w", err)
	case m != recordsConfirm:
		return nil, fmt.Errorf("%w: bad confirmation of records %q", ErrBadFrame, m[:])
	}
	return switchToRecords(rc, keys)
}

// serverRecords runs a server's handshake on rc under cfg, confirms
// and returns the record connection and the client's certificate name.
func serverRecords(rc *recordConn, cfg *tls.Config) (net.Conn, string, error) {
	tc := tls.Server(rc, cfg)
	rc.SetDeadline(time.Now().Add(handshakeTimeout))
	defer rc.SetDeadline(time.Time{})
	if err := tc.Handshake(); err != nil {
		return nil, "", explainHandshake(err)
	}
	cs := tc.ConnectionState()
	keys, err := keysOf(cs, wantProto(cfg), false)
	if err != nil {
		return nil, "", err
	}
	if _, err := tc.Write(recordsConfirm[:]); err != nil {
		return nil, "", err
	}
	peer := ""
	if len(cs.PeerCertificates) > 0 {
		peer = cs.PeerCertificates[0].Subject.CommonName
	}
	mc, err := switchToRecords(rc, keys)
	return mc, peer, err
}

// errBadMAC is wrapped (with ErrBadFrame) by a record whose tag fails.
var errBadMAC = errors.New("a record's MAC does not verify: altered, replayed, reordered or from another connection")
