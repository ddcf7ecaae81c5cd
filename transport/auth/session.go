package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Roles, as in cluster.Task.Type.
const (
	RoleChief  = "chief"
	RolePS     = "ps"
	RoleWorker = "worker"
	// RoleStandby is a shard's second process (--ps-replicas 1): it runs
	// the PS code; which of ps/N and standby/N is the primary is the
	// chief's call.
	RoleStandby = "standby"
)

// roleCodes number the roles on the data plane (append only: a code is
// on the wire).
var roleCodes = [...]string{RoleChief, RolePS, RoleWorker, RoleStandby}

// RoleCode is role's number on the data plane (-1 if unknown).
func RoleCode(role string) int {
	for i, r := range roleCodes {
		if r == role {
			return i
		}
	}
	return -1
}

// RoleOf is the role numbered c ("" if none).
func RoleOf(c byte) string {
	if int(c) < len(roleCodes) {
		return roleCodes[c]
	}
	return ""
}

// Identity is who a session belongs to.
type Identity struct {
	Role    string
	Index   int
	Session uint64
}

// Task is the identity's task name, "worker/1".
func (id Identity) Task() string { return fmt.Sprintf("%s/%d", id.Role, id.Index) }

// CertName is the common name of the identity's certificate ("worker-1",
// as transport/certs names them).
func (id Identity) CertName() string { return fmt.Sprintf("%s-%d", id.Role, id.Index) }

// MACLen is the length of a request MAC: HMAC-SHA256 truncated to 128
// bits, as RFC 2104 allows (at least half the hash).
const MACLen = 16

// Reasons a request is refused (the reason label of the
// rejected_requests_total counters).
const (
	ReasonNoCredential  = "no_credential"
	ReasonBadCredential = "bad_credential"
	ReasonForbidden     = "forbidden"
	ReasonCertificate   = "certificate"
)

// Error is a refused request: why, for the counters, and what to say.
type Error struct {
	Reason string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func refuse(reason, format string, args ...any) error {
	return &Error{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Reason is err's refusal reason ("" if err is not a refusal).
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// Keyring holds a run's token and derives session keys, caching them: a
// data-plane frame costs one HMAC of its header, not a derivation too.
type Keyring struct {
	token Token

	mu    sync.Mutex
	cache map[Identity][]byte
}

// maxCached bounds the cache: a client sending made-up sessions can cost
// derivations, not memory.
const maxCached = 1024

// NewKeyring returns the keyring of a run's token.
func NewKeyring(t Token) *Keyring {
	return &Keyring{token: t, cache: map[Identity][]byte{}}
}

// SessionKey is K = HMAC(token, "pstrain/session/v1" | role | index |
// session).
func (k *Keyring) SessionKey(id Identity) []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	if key, ok := k.cache[id]; ok {
		return key
	}
	m := hmac.New(sha256.New, k.token)
	m.Write([]byte("pstrain/session/v1\x00" + id.Role + "\x00"))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(int64(id.Index)))
	binary.LittleEndian.PutUint64(b[8:], id.Session)
	m.Write(b[:])
	key := m.Sum(nil)
	if len(k.cache) >= maxCached {
		clear(k.cache)
	}
	k.cache[id] = key
	return key
}

// mac is HMAC-SHA256(key, domain | parts...) truncated to MACLen.
func mac(key []byte, domain string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(domain))
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)[:MACLen]
}

// FrameMAC authenticates a data-plane request header (everything before
// the MAC) for the session id.
func (k *Keyring) FrameMAC(id Identity, header []byte) []byte {
	return mac(k.SessionKey(id), "pstrain/frame/v1\x00", header)
}

// VerifyFrame checks a data-plane frame's MAC.
func (k *Keyring) VerifyFrame(id Identity, header, got []byte) error {
	if RoleCode(id.Role) < 0 {
		return refuse(ReasonBadCredential, "unknown role in the request")
	}
	if !hmac.Equal(k.FrameMAC(id, header), got) {
		return refuse(ReasonBadCredential, "%s: the request's credential does not match this run's token (session %x)", id.Task(), id.Session)
	}
	return nil
}

// callMAC authenticates a gRPC call of method.
func (k *Keyring) callMAC(id Identity, method string) []byte {
	return mac(k.SessionKey(id), "pstrain/call/v1\x00", []byte(method))
}

// CallCredential is the value of the "pstrain-auth" metadata of a call of
// method: "v1:role:index:session:mac", the numbers in hex.
func (k *Keyring) CallCredential(id Identity, method string) string {
	return fmt.Sprintf("v1:%s:%d:%x:%x", id.Role, id.Index, id.Session, k.callMAC(id, method))
}

// ParseCallCredential splits a "pstrain-auth" value; it does not verify
// the MAC.
func ParseCallCredential(s string) (Identity, []byte, error) {
	f := strings.Split(s, ":")
	if len(f) != 5 || f[0] != "v1" {
		return Identity{}, nil, refuse(ReasonBadCredential, "malformed credential (want v1:role:index:session:mac)")
	}
	id, err := parseIdentity(f[1], f[2], f[3])
	if err != nil {
		return Identity{}, nil, err
	}
	m, err := parseHex(f[4], MACLen)
	if err != nil {
		return Identity{}, nil, err
	}
	return id, m, nil
}

func parseIdentity(role, index, session string) (Identity, error) {
	if RoleCode(role) < 0 {
		return Identity{}, refuse(ReasonBadCredential, "unknown role %q in the credential", role)
	}
	i, err := strconv.Atoi(index)
	if err != nil || i < 0 || i > 1<<20 {
		return Identity{}, refuse(ReasonBadCredential, "bad task index %q in the credential", index)
	}
	s, err := strconv.ParseUint(session, 16, 64)
	if err != nil {
		return Identity{}, refuse(ReasonBadCredential, "bad session %q in the credential", session)
	}
	return Identity{Role: role, Index: i, Session: s}, nil
}

func parseHex(s string, n int) ([]byte, error) {
	if len(s) != 2*n {
		return nil, refuse(ReasonBadCredential, "the credential's MAC has %d hex digits, want %d", len(s), 2*n)
	}
	b := make([]byte, n)
	for i := range b {
		v, err := strconv.ParseUint(s[2*i:2*i+2], 16, 8)
		if err != nil {
			return nil, refuse(ReasonBadCredential, "the credential's MAC is not hex")
		}
		b[i] = byte(v)
	}
	return b, nil
}

// VerifyCall checks a "pstrain-auth" value for method and returns who
// sent it.
func (k *Keyring) VerifyCall(cred, method string) (Identity, error) {
	id, got, err := ParseCallCredential(cred)
	if err != nil {
		return Identity{}, err
	}
	if !hmac.Equal(k.callMAC(id, method), got) {
		return Identity{}, refuse(ReasonBadCredential, "%s: the credential does not match this run's token (was the task started with another --auth-token-file, or with the token of another run?)", id.Task())
	}
	return id, nil
}

// MaxClockSkew is how far a registration's time may be from the chief's
// clock.
const MaxClockSkew = 10 * time.Minute

func (k *Keyring) registerMAC(role string, index int, unixNano int64) []byte {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(int64(index)))
	binary.LittleEndian.PutUint64(b[8:], uint64(unixNano))
	return mac(k.token, "pstrain/register/v1\x00"+role+"\x00", b[:])
}

// RegisterProof is the value of the "pstrain-register" metadata a task
// sends with its registration: "v1:role:index:unixnano:mac".
func (k *Keyring) RegisterProof(role string, index int, now time.Time) string {
	t := now.UnixNano()
	return fmt.Sprintf("v1:%s:%d:%x:%x", role, index, t, k.registerMAC(role, index, t))
}

// VerifyRegister checks a registration proof against the chief's clock
// and returns the role and index it proves (Session 0).
func (k *Keyring) VerifyRegister(proof string, now time.Time) (Identity, error) {
	id, got, err := ParseCallCredential(proof)
	if err != nil {
		return Identity{}, err
	}
	t := int64(id.Session) // the third field is the time here
	if !hmac.Equal(k.registerMAC(id.Role, id.Index, t), got) {
		return Identity{}, refuse(ReasonBadCredential, "%s: registration refused: its proof does not match this run's token (every task of a run needs the same --auth-token-file)", id.Task())
	}
	if d := now.Sub(time.Unix(0, t)); d > MaxClockSkew || d < -MaxClockSkew {
		return Identity{}, refuse(ReasonBadCredential, "%s: registration refused: its clock is %v from the chief's (at most %v)", id.Task(), d.Round(time.Second), MaxClockSkew)
	}
	id.Session = 0
	return id, nil
}
