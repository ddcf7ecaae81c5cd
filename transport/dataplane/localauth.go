package dataplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Same-host connections under TLS: when the TCP plane is mutual TLS, a
// client and a server on one host still use the Unix socket and the
// shared-memory region (local.go, shm.go), with the certificates doing
// on that socket what the TLS handshake does on TCP: each end proves it
// holds the private key of a certificate the cluster's CA signed, so
// the server binds the connection to the certificate's name exactly as
// it binds a TLS connection (auth.CheckCertificate), and the client
// knows it talks to a task of the cluster. What TLS adds on TCP, secrecy
// and integrity on the wire, the kernel gives a Unix socket: its bytes
// never leave the host's memory, and only root (trusted: docs/security.md)
// can read them there.
//
// The exchange, before the shared-memory preamble and any frame, all
// integers little-endian:
//
//	client: "PSL1" | client nonce [32] | client pid u32 | chain
//	server: "PSL1" | status u8 | server nonce [32] | server pid u32 | chain |
//	        signature length u16 | server signature
//	client: signature length u16 | client signature
//	server: "PSL1" | status u8
//
//	chain:  count u8 | (length u32 | DER certificate) per certificate, leaf first
//
// Each end signs SHA-256("pstrain/local/v1/" role "\x00" | client nonce |
// server nonce | client pid | server pid | SHA-256(client chain) |
// SHA-256(server chain)) with its certificate's key. The pids are bound
// to the kernel's word: each end checks that the pid the other signed as
// its own is the pid SO_PEERCRED reports for the socket's other end, and
// that that process runs as its own user. So a process that relays the
// exchange between a client and the server (having taken the socket's
// name first) is refused: its pid is not the one the client signed. A
// status other than localOK ends the connection.

var localMagic = [4]byte{'P', 'S', 'L', '1'}

// Local exchange statuses.
const (
	localOK      = 0
	localRefused = 1 // the peer's certificate, signature or process did not verify
)

const (
	localNonceLen  = 32
	maxLocalChain  = 4        // certificates in a chain
	maxLocalCert   = 16 << 10 // bytes in one certificate
	maxLocalSigLen = 1024     // bytes in a signature (RSA-4096 is 512)
)

// LocalAuth is a task's certificate and the cluster's CA, for same-host
// connections under TLS (see above).
type LocalAuth struct {
	Cert  tls.Certificate // the task's chain, leaf first, and its key (a crypto.Signer)
	Roots *x509.CertPool  // the CA that signs every task
}

// localAuthOf takes the task's certificate and CA from a TLS
// configuration (roots: its RootCAs on a client, its ClientCAs on a
// server); nil when it has no certificate with a signing key or no CA.
func localAuthOf(cfg *tls.Config, roots *x509.CertPool) *LocalAuth {
	if cfg == nil || roots == nil || len(cfg.Certificates) == 0 {
		return nil
	}
	c := cfg.Certificates[0]
	if _, ok := c.PrivateKey.(crypto.Signer); !ok || len(c.Certificate) == 0 {
		return nil
	}
	return &LocalAuth{Cert: c, Roots: roots}
}

// peerProc is the process at the other end of a Unix connection, as the
// kernel reports it (SO_PEERCRED).
type peerProc struct {
	uid, pid int
}

// localHello is a decoded first message of either end.
type localHello struct {
	nonce [localNonceLen]byte
	pid   uint32
	chain [][]byte
}

func appendChain(b []byte, chain [][]byte) []byte {
	b = append(b, byte(len(chain)))
	for _, der := range chain {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(der)))
		b = append(b, der...)
	}
	return b
}

// readChain reads a chain, bounded in certificates and bytes.
func readChain(rd io.Reader) ([][]byte, error) {
	var n [1]byte
	if _, err := io.ReadFull(rd, n[:]); err != nil {
		return nil, err
	}
	if n[0] == 0 || n[0] > maxLocalChain {
		return nil, fmt.Errorf("%w: a chain of %d certificates", ErrBadFrame, n[0])
	}
	chain := make([][]byte, n[0])
	for i := range chain {
		var l [4]byte
		if _, err := io.ReadFull(rd, l[:]); err != nil {
			return nil, err
		}
		size := binary.LittleEndian.Uint32(l[:])
		if size == 0 || size > maxLocalCert {
			return nil, fmt.Errorf("%w: a certificate of %d bytes", ErrBadFrame, size)
		}
		chain[i] = make([]byte, size)
		if _, err := io.ReadFull(rd, chain[i]); err != nil {
			return nil, err
		}
	}
	return chain, nil
}

func appendHello(b []byte, h localHello) []byte {
	b = append(b, h.nonce[:]...)
	b = binary.LittleEndian.AppendUint32(b, h.pid)
	return appendChain(b, h.chain)
}

func readHello(rd io.Reader) (localHello, error) {
	var h localHello
	var fixed [localNonceLen + 4]byte
	if _, err := io.ReadFull(rd, fixed[:]); err != nil {
		return h, err
	}
	copy(h.nonce[:], fixed[:localNonceLen])
	h.pid = binary.LittleEndian.Uint32(fixed[localNonceLen:])
	var err error
	h.chain, err = readChain(rd)
	return h, err
}

func appendSig(b, sig []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(sig)))
	return append(b, sig...)
}

func readSig(rd io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(rd, l[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint16(l[:])
	if n == 0 || n > maxLocalSigLen {
		return nil, fmt.Errorf("%w: a signature of %d bytes", ErrBadFrame, n)
	}
	sig := make([]byte, n)
	_, err := io.ReadFull(rd, sig)
	return sig, err
}

// localTranscript is what the end called role signs.
func localTranscript(role string, client, server localHello) []byte {
	h := sha256.New()
	h.Write([]byte("pstrain/local/v1/" + role + "\x00"))
	h.Write(client.nonce[:])
	h.Write(server.nonce[:])
	var pids [8]byte
	binary.LittleEndian.PutUint32(pids[:4], client.pid)
	binary.LittleEndian.PutUint32(pids[4:], server.pid)
	h.Write(pids[:])
	for _, chain := range [][][]byte{client.chain, server.chain} {
		ch := sha256.New()
		for _, der := range chain {
			ch.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(der))))
			ch.Write(der)
		}
		h.Write(ch.Sum(nil))
	}
	return h.Sum(nil)
}

// sign signs msg with the task's key: its SHA-256 for ECDSA and RSA
// (PKCS #1 v1.5), msg itself for Ed25519, as x509's CheckSignature
// expects for the matching algorithms.
func (a *LocalAuth) sign(msg []byte) ([]byte, error) {
	signer := a.Cert.PrivateKey.(crypto.Signer)
	if _, ok := signer.Public().(ed25519.PublicKey); ok {
		return signer.Sign(rand.Reader, msg, crypto.Hash(0))
	}
	d := sha256.Sum256(msg)
	return signer.Sign(rand.Reader, d[:], crypto.SHA256)
}

// sigAlgorithm is the x509 algorithm of a signature made by sign with
// the key of pub.
func sigAlgorithm(pub any) x509.SignatureAlgorithm {
	switch pub.(type) {
	case *ecdsa.PublicKey:
		return x509.ECDSAWithSHA256
	case *rsa.PublicKey:
		return x509.SHA256WithRSA
	case ed25519.PublicKey:
		return x509.PureEd25519
	}
	return x509.UnknownSignatureAlgorithm
}

// verifyPeer checks a peer's chain against the CA for usage (a client's
// certificate for client authentication, a server's for server
// authentication) and its signature over msg; it returns the leaf.
func (a *LocalAuth) verifyPeer(chain [][]byte, usage x509.ExtKeyUsage, msg, sig []byte, now time.Time) (*x509.Certificate, error) {
	certs := make([]*x509.Certificate, len(chain))
	for i, der := range chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("the peer's certificate: %w", err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.Roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return nil, fmt.Errorf("the peer's certificate: %w", err)
	}
	if err := leaf.CheckSignature(sigAlgorithm(leaf.PublicKey), msg, sig); err != nil {
		return nil, fmt.Errorf("the peer's signature: %w", err)
	}
	return leaf, nil
}

// checkProc checks that the pid a peer signed as its own is the process
// the kernel reports at the socket's other end, and that it runs as uid.
func checkProc(signed uint32, peer peerProc, uid int) error {
	switch {
	case peer.uid != uid:
		return fmt.Errorf("the peer runs as user %d, not %d", peer.uid, uid)
	case int(signed) != peer.pid:
		return fmt.Errorf("the peer signed as process %d but the socket's other end is process %d", signed, peer.pid)
	}
	return nil
}

func (a *LocalAuth) hello(pid int) (localHello, error) {
	h := localHello{pid: uint32(pid), chain: a.Cert.Certificate}
	_, err := rand.Read(h.nonce[:])
	return h, err
}

// errLocalRefused: the other end refused the exchange.
var errLocalRefused = errors.New("dataplane: same-host authentication refused by the peer")

// clientExchange runs the client's side over rw, whose other end the
// kernel reports as peer; it returns the server certificate's name.
// errNoPreamble: the server does not take the exchange (a plaintext
// server, which refuses it as a bad magic).
func (a *LocalAuth) clientExchange(rw io.ReadWriter, self int, peer peerProc, uid int, now time.Time) (string, error) {
	ch, err := a.hello(self)
	if err != nil {
		return "", err
	}
	if _, err := rw.Write(appendHello(append([]byte(nil), localMagic[:]...), ch)); err != nil {
		return "", closedByServer(err)
	}
	var head [5]byte
	if _, err := io.ReadFull(rw, head[:]); err != nil {
		return "", closedByServer(err)
	}
	if [4]byte(head[:4]) != localMagic {
		return "", errNoPreamble
	}
	if head[4] != localOK {
		return "", errLocalRefused
	}
	sh, err := readHello(rw)
	if err != nil {
		return "", err
	}
	ssig, err := readSig(rw)
	if err != nil {
		return "", err
	}
	leaf, err := a.verifyPeer(sh.chain, x509.ExtKeyUsageServerAuth, localTranscript("server", ch, sh), ssig, now)
	if err == nil {
		err = checkProc(sh.pid, peer, uid)
	}
	if err != nil {
		return "", fmt.Errorf("same-host server: %w", err)
	}
	csig, err := a.sign(localTranscript("client", ch, sh))
	if err != nil {
		return "", err
	}
	if _, err := rw.Write(appendSig(nil, csig)); err != nil {
		return "", closedByServer(err)
	}
	if _, err := io.ReadFull(rw, head[:]); err != nil {
		return "", closedByServer(err)
	}
	if [4]byte(head[:4]) != localMagic || head[4] != localOK {
		return "", errLocalRefused
	}
	return leaf.Subject.CommonName, nil
}

// serverExchange runs the server's side over rw, after the client's
// magic (read by the caller); it returns the client certificate's name.
// On an error the client has been told it is refused when it could be.
func (a *LocalAuth) serverExchange(rw io.ReadWriter, self int, peer peerProc, uid int, now time.Time) (string, error) {
	ch, err := readHello(rw)
	if err != nil {
		return "", err
	}
	refused := func(err error) (string, error) {
		rw.Write(append(localMagic[:len(localMagic):len(localMagic)], localRefused))
		return "", err
	}
	// The kernel's word first: nothing is signed for a process of
	// another user, or one that is not who it says it is.
	if err := checkProc(ch.pid, peer, uid); err != nil {
		return refused(err)
	}
	sh, err := a.hello(self)
	if err != nil {
		return refused(err)
	}
	ssig, err := a.sign(localTranscript("server", ch, sh))
	if err != nil {
		return refused(err)
	}
	msg := append(localMagic[:len(localMagic):len(localMagic)], localOK)
	if _, err := rw.Write(appendSig(appendHello(msg, sh), ssig)); err != nil {
		return "", err
	}
	csig, err := readSig(rw)
	if err != nil {
		return "", err
	}
	leaf, err := a.verifyPeer(ch.chain, x509.ExtKeyUsageClientAuth, localTranscript("client", ch, sh), csig, now)
	if err == nil && leaf.Subject.CommonName == "" {
		err = errors.New("the peer's certificate names no task (empty common name)")
	}
	if err != nil {
		return refused(err)
	}
	if _, err := rw.Write(append(localMagic[:len(localMagic):len(localMagic)], localOK)); err != nil {
		return "", err
	}
	return leaf.Subject.CommonName, nil
}
