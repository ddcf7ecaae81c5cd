// Package auth authenticates and authorizes the tasks of one run: only a
// process that holds the run's secret can register with the chief, and
// every later request to a parameter server or the chief carries a
// per-task session credential that names its role and index and proves
// it was issued by the chief. docs/security.md has the threat model.
//
// The scheme, in three steps:
//
//  1. Every task of a run reads the same secret, the run's token (a file
//     made by `pstrain run`, `pstrain certs` or `pstrain token`, or a
//     Kubernetes Secret; --auth-token-file).
//  2. A task registers with the chief sending a proof, an HMAC of its role,
//     index and the time under the token. The chief answers with a fresh
//     random session number. Both sides derive the session key
//     K = HMAC(token, "session" | role | index | session); the chief
//     keeps no table of sessions, so a parameter server (which also holds
//     the token) verifies a session without asking the chief.
//  3. A gRPC call carries role, index, session and an HMAC of the method
//     name under K (metadata "pstrain-auth"); a data-plane frame carries
//     them in its header with an HMAC of the header under K. The server
//     checks the MAC, then the Policy: control calls are the chief's
//     alone, a worker pulls and pushes only as itself. With mutual TLS
//     the peer certificate's name must also be the claimed task.
//
// A request that fails any check is refused with Unauthenticated or
// PermissionDenied and reaches no handler.
package auth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pstrain/pstrain/internal/atomicfile"
)

// Token is a run's secret.
type Token []byte

// MinTokenLen is the shortest secret accepted, in bytes (a generated one
// is 64 hex characters: 256 bits).
const MinTokenLen = 32

// TokenFile is the token's file name inside a run or TLS directory.
const TokenFile = "auth-token"

// NewToken returns a fresh random token (64 hex characters) read from r
// (crypto/rand when nil).
func NewToken(r io.Reader) (Token, error) {
	if r == nil {
		r = rand.Reader
	}
	var b [32]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return nil, fmt.Errorf("auth: making a token: %w", err)
	}
	return Token(hex.EncodeToString(b[:])), nil
}

// ParseToken checks a token's text: surrounding white space is ignored
// (a Secret or an editor may add a newline) and at least MinTokenLen bytes
// must remain.
func ParseToken(b []byte) (Token, error) {
	t := strings.TrimSpace(string(b))
	if len(t) < MinTokenLen {
		return nil, fmt.Errorf("auth: the token has %d characters, need at least %d (make one with `pstrain token FILE`)", len(t), MinTokenLen)
	}
	return Token(t), nil
}

// ReadTokenFile reads and checks a token file.
func ReadTokenFile(path string) (Token, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: reading the run's token: %w", err)
	}
	t, err := ParseToken(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// EnsureTokenFile returns the token in path, making the file (mode 0600,
// written to a temporary file and renamed) when it does not exist.
func EnsureTokenFile(path string) (Token, error) {
	t, err := ReadTokenFile(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return t, err
	}
	if t, err = NewToken(nil); err != nil {
		return nil, err
	}
	return t, WriteTokenFile(path, t)
}

// WriteTokenFile writes t to path with mode 0600, atomically.
func WriteTokenFile(path string, t Token) error {
	if err := atomicfile.Write(path, append([]byte(t), '\n'), 0o600, atomicfile.Options{Sync: true, ExactMode: true}); err != nil {
		return fmt.Errorf("auth: the token: %w", err)
	}
	return nil
}
