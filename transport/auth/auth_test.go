package auth

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/pstrain/pstrain/proto"
)

func testKeys(t *testing.T, seed byte) *Keyring {
	t.Helper()
	tok, err := NewToken(bytes.NewReader(bytes.Repeat([]byte{seed}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return NewKeyring(tok)
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, TokenFile)
	a, err := EnsureTokenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 64 {
		t.Fatalf("token of %d characters, want 64", len(a))
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := EnsureTokenFile(p)
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("second Ensure: %q, %v; want the same token", b, err)
	}
	// White space around it (a Secret's newline) is not part of it.
	if err := os.WriteFile(p, append([]byte("\n  "), append(a, "\r\n"...)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := ReadTokenFile(p); err != nil || !bytes.Equal(a, c) {
		t.Fatalf("padded token: %q, %v", c, err)
	}
	os.WriteFile(p, []byte("short"), 0o600)
	if _, err := ReadTokenFile(p); err == nil || !strings.Contains(err.Error(), "at least") {
		t.Fatalf("short token: %v", err)
	}
}

func TestCallCredential(t *testing.T) {
	k := testKeys(t, 1)
	id := Identity{Role: RoleWorker, Index: 1, Session: 0xfeed}
	cred := k.CallCredential(id, pb.ParameterServer_Push_FullMethodName)
	got, err := k.VerifyCall(cred, pb.ParameterServer_Push_FullMethodName)
	if err != nil || got != id {
		t.Fatalf("VerifyCall = %+v, %v; want %+v", got, err, id)
	}
	refusals := map[string]struct {
		cred, method string
		keys         *Keyring
	}{
		"another method":  {cred, pb.ParameterServer_Stop_FullMethodName, k},
		"another token":   {cred, pb.ParameterServer_Push_FullMethodName, testKeys(t, 2)},
		"claims worker 0": {strings.Replace(cred, ":worker:1:", ":worker:0:", 1), pb.ParameterServer_Push_FullMethodName, k},
		"claims chief":    {strings.Replace(cred, ":worker:1:", ":chief:1:", 1), pb.ParameterServer_Push_FullMethodName, k},
		"other session":   {strings.Replace(cred, ":feed:", ":beef:", 1), pb.ParameterServer_Push_FullMethodName, k},
		"garbage":         {"v1:worker:1", pb.ParameterServer_Push_FullMethodName, k},
		"empty":           {"", pb.ParameterServer_Push_FullMethodName, k},
	}
	for name, c := range refusals {
		if _, err := c.keys.VerifyCall(c.cred, c.method); Reason(err) != ReasonBadCredential {
			t.Errorf("%s: %v, want a bad_credential refusal", name, err)
		}
	}
}

// A standby has a session like a PS: its credential and registration
// proof verify as standby/N, it may not pose as ps/N, and its role has a
// data-plane code of its own.
func TestStandbySession(t *testing.T) {
	k := testKeys(t, 1)
	id := Identity{Role: RoleStandby, Index: 1, Session: 0xabc}
	cred := k.CallCredential(id, pb.ParameterServer_Replicate_FullMethodName)
	if got, err := k.VerifyCall(cred, pb.ParameterServer_Replicate_FullMethodName); err != nil || got != id {
		t.Fatalf("VerifyCall = %+v, %v; want %+v", got, err, id)
	}
	posing := strings.Replace(cred, ":standby:1:", ":ps:1:", 1)
	if _, err := k.VerifyCall(posing, pb.ParameterServer_Replicate_FullMethodName); Reason(err) != ReasonBadCredential {
		t.Fatalf("standby/1's credential as ps/1: %v", err)
	}
	now := time.Unix(1700000000, 0)
	if got, err := k.VerifyRegister(k.RegisterProof(RoleStandby, 1, now), now); err != nil || got.Role != RoleStandby || got.Index != 1 {
		t.Fatalf("VerifyRegister = %+v, %v", got, err)
	}
	c := RoleCode(RoleStandby)
	if c < 0 || RoleOf(byte(c)) != RoleStandby || c == RoleCode(RolePS) {
		t.Fatalf("standby's data-plane code %d maps back to %q", c, RoleOf(byte(c)))
	}
}

func TestFrameMAC(t *testing.T) {
	k := testKeys(t, 1)
	id := Identity{Role: RoleWorker, Index: 0, Session: 7}
	hdr := []byte("PSD3 a header")
	m := k.FrameMAC(id, hdr)
	if len(m) != MACLen {
		t.Fatalf("MAC of %d bytes", len(m))
	}
	if err := k.VerifyFrame(id, hdr, m); err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), hdr...)
	flipped[5] ^= 1
	for name, err := range map[string]error{
		"changed header": k.VerifyFrame(id, flipped, m),
		"other identity": k.VerifyFrame(Identity{Role: RoleWorker, Index: 1, Session: 7}, hdr, m),
		"other token":    testKeys(t, 3).VerifyFrame(id, hdr, m),
		"unknown role":   k.VerifyFrame(Identity{Role: "root", Session: 7}, hdr, m),
	} {
		if Reason(err) != ReasonBadCredential {
			t.Errorf("%s: %v, want bad_credential", name, err)
		}
	}
}

func TestRegisterProof(t *testing.T) {
	k := testKeys(t, 1)
	now := time.Unix(1_800_000_000, 0)
	proof := k.RegisterProof(RolePS, 1, now)
	id, err := k.VerifyRegister(proof, now.Add(time.Minute))
	if err != nil || id != (Identity{Role: RolePS, Index: 1}) {
		t.Fatalf("VerifyRegister = %+v, %v", id, err)
	}
	if _, err := k.VerifyRegister(proof, now.Add(MaxClockSkew+time.Second)); err == nil || !strings.Contains(err.Error(), "clock") {
		t.Fatalf("stale proof: %v", err)
	}
	if _, err := testKeys(t, 2).VerifyRegister(proof, now); err == nil || !strings.Contains(err.Error(), "--auth-token-file") {
		t.Fatalf("proof of another token: %v", err)
	}
	if _, err := k.VerifyRegister(strings.Replace(proof, ":ps:1:", ":ps:0:", 1), now); Reason(err) != ReasonBadCredential {
		t.Fatalf("proof for another index: %v", err)
	}
}

func TestAllow(t *testing.T) {
	chief := Identity{Role: RoleChief, Session: 1}
	w0 := Identity{Role: RoleWorker, Index: 0, Session: 2}
	w1 := Identity{Role: RoleWorker, Index: 1, Session: 3}
	ps0 := Identity{Role: RolePS, Index: 0, Session: 4}
	ps1 := Identity{Role: RolePS, Index: 1, Session: 5}
	sb0 := Identity{Role: RoleStandby, Index: 0, Session: 6}
	sb1 := Identity{Role: RoleStandby, Index: 1, Session: 7}
	cases := []struct {
		id     Identity
		method string
		req    any
		want   string // "" allowed, else the refusal reason
	}{
		{chief, pb.ParameterServer_Init_FullMethodName, &pb.InitRequest{}, ""},
		{chief, pb.ParameterServer_Stop_FullMethodName, &pb.StopRequest{}, ""},
		{chief, pb.ParameterServer_Checkpoint_FullMethodName, &pb.CheckpointRequest{}, ""},
		{chief, pb.ParameterServer_SetMembership_FullMethodName, &pb.MembershipRequest{}, ""},
		{w0, pb.ParameterServer_Stop_FullMethodName, &pb.StopRequest{Shutdown: true}, ReasonForbidden},
		{w0, pb.ParameterServer_Init_FullMethodName, &pb.InitRequest{}, ReasonForbidden},
		{ps0, pb.ParameterServer_Checkpoint_FullMethodName, &pb.CheckpointRequest{}, ReasonForbidden},
		{w0, pb.ParameterServer_Push_FullMethodName, &pb.PushRequest{Worker: 0}, ""},
		// Hot standbys: the chief alone promotes and attaches; a shard's
		// two processes (either may be the primary) alone replicate it.
		{chief, pb.ParameterServer_Promote_FullMethodName, &pb.PromoteRequest{Epoch: 2}, ""},
		{chief, pb.ParameterServer_SetStandby_FullMethodName, &pb.SetStandbyRequest{Epoch: 2}, ""},
		{ps0, pb.ParameterServer_Promote_FullMethodName, &pb.PromoteRequest{Epoch: 2}, ReasonForbidden},
		{sb0, pb.ParameterServer_Promote_FullMethodName, &pb.PromoteRequest{Epoch: 2}, ReasonForbidden},
		{w0, pb.ParameterServer_SetStandby_FullMethodName, &pb.SetStandbyRequest{Epoch: 2}, ReasonForbidden},
		{sb0, pb.ParameterServer_SetStandby_FullMethodName, &pb.SetStandbyRequest{Epoch: 2}, ReasonForbidden},
		{ps0, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 0}, ""},
		{sb0, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 0}, ""},
		{sb1, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 1}, ""},
		{ps1, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 0}, ReasonForbidden},
		{sb1, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 0}, ReasonForbidden},
		{chief, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 0}, ReasonForbidden},
		{w0, pb.ParameterServer_Replicate_FullMethodName, &pb.ReplicaBatch{Shard: 0}, ReasonForbidden},
		{ps0, pb.ParameterServer_Replicate_FullMethodName, nil, ReasonForbidden}, // no batch: shard 0 by default, but not from an untyped request
		{sb0, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: 0}, ReasonForbidden},
		{sb0, pb.ParameterServer_Status_FullMethodName, &pb.StatusRequest{}, ""},
		{w1, pb.ParameterServer_Push_FullMethodName, &pb.PushRequest{Worker: 0}, ReasonForbidden},
		{chief, pb.ParameterServer_Push_FullMethodName, &pb.PushRequest{Worker: 0}, ReasonForbidden},
		{w1, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: 1}, ""},
		{w1, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: -1}, ReasonForbidden},
		{w1, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: 1, Retain: true}, ReasonForbidden},
		{chief, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: -1, Retain: true}, ""},
		{chief, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: -1}, ""},
		{chief, pb.ParameterServer_Pull_FullMethodName, &pb.PullRequest{Worker: 0}, ReasonForbidden},
		{ps0, pb.ParameterServer_Status_FullMethodName, &pb.StatusRequest{}, ""},
		{w0, pb.Chief_Heartbeat_FullMethodName, &pb.HeartbeatRequest{Worker: 0}, ""},
		{w0, pb.Chief_Heartbeat_FullMethodName, &pb.HeartbeatRequest{Worker: 1}, ReasonForbidden},
		{chief, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil, ReasonForbidden},
		// Embedding rows: as parameters; loading them is the chief's.
		{w1, pb.ParameterServer_PullRows_FullMethodName, &pb.PullRowsRequest{Worker: 1}, ""},
		{w1, pb.ParameterServer_PullRows_FullMethodName, &pb.PullRowsRequest{Worker: 0}, ReasonForbidden},
		{chief, pb.ParameterServer_PullRows_FullMethodName, &pb.PullRowsRequest{Worker: -1}, ""},
		{w0, pb.ParameterServer_PushRows_FullMethodName, &pb.PushRowsRequest{Worker: 0}, ""},
		{w0, pb.ParameterServer_PushRows_FullMethodName, &pb.PushRowsRequest{Worker: 1}, ReasonForbidden},
		{chief, pb.ParameterServer_PushRows_FullMethodName, &pb.PushRowsRequest{Worker: 0}, ReasonForbidden},
		{chief, pb.ParameterServer_LoadRows_FullMethodName, &pb.LoadRowsRequest{}, ""},
		{w0, pb.ParameterServer_LoadRows_FullMethodName, &pb.LoadRowsRequest{}, ReasonForbidden},
	}
	for _, c := range cases {
		if got := Reason(Allow(c.id, c.method, c.req)); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.id.Task(), c.method, got, c.want)
		}
	}
}

func TestCheckCertificate(t *testing.T) {
	w1 := Identity{Role: RoleWorker, Index: 1}
	if err := CheckCertificate("worker-1", w1); err != nil {
		t.Fatal(err)
	}
	if err := CheckCertificate("", w1); err != nil {
		t.Fatalf("no TLS: %v", err)
	}
	if Reason(CheckCertificate("worker-0", w1)) != ReasonCertificate {
		t.Fatal("worker-0's certificate acted as worker/1")
	}
	if err := CheckCertificate("standby-0", Identity{Role: RoleStandby}); err != nil {
		t.Fatalf("standby/0 with its certificate: %v", err)
	}
	if Reason(CheckCertificate("ps-0", Identity{Role: RoleStandby})) != ReasonCertificate {
		t.Fatal("ps/0's certificate acted as standby/0")
	}
	if Reason(CheckCertificate("worker-1", Identity{Role: RoleChief})) != ReasonCertificate {
		t.Fatal("a worker's certificate acted as the chief")
	}
}

// FuzzParseCallCredential: no input makes the parser panic, and a parsed
// credential names a known role, a sane index and a full MAC.
func FuzzParseCallCredential(f *testing.F) {
	k := NewKeyring(Token(strings.Repeat("k", 32)))
	f.Add(k.CallCredential(Identity{Role: RoleWorker, Index: 3, Session: 99}, "/m"))
	f.Add(k.RegisterProof(RolePS, 0, time.Unix(1, 0)))
	f.Add("v1:chief:0:0:")
	f.Add("v1:worker:-1:ffffffffffffffffff:00")
	f.Add("::::")
	f.Fuzz(func(t *testing.T, s string) {
		id, m, err := ParseCallCredential(s)
		if err != nil {
			if Reason(err) != ReasonBadCredential {
				t.Fatalf("refusal without a reason: %v", err)
			}
			return
		}
		if RoleCode(id.Role) < 0 || id.Index < 0 || len(m) != MACLen {
			t.Fatalf("accepted %q as %+v with a %d-byte MAC", s, id, len(m))
		}
		// The identity survives encoding, and only the real MAC verifies.
		again, _, err := ParseCallCredential(k.CallCredential(id, "/m"))
		if err != nil || again != id {
			t.Fatalf("%+v re-encoded parses as %+v, %v", id, again, err)
		}
		if _, err := k.VerifyCall(s, "/m"); err == nil && !bytes.Equal(m, k.callMAC(id, "/m")) {
			t.Fatalf("%q verified with a MAC that is not the identity's", s)
		}
	})
}

// BenchmarkFrameMAC: what authentication adds to a data-plane request,
// signing its header (client) and verifying it (server), the session key
// cached. Compare with BenchmarkAuthCost's unsigned µs/op in
// transport/dataplane (a push and a pull of a default shard).
func BenchmarkFrameMAC(b *testing.B) {
	k := NewKeyring(Token(strings.Repeat("k", 64)))
	id := Identity{Role: RoleWorker, Index: 1, Session: 0xabcdef}
	hdr := make([]byte, 7+20+36+13) // a header with a 20-byte run id
	for i := 0; i < b.N; i++ {
		if err := k.VerifyFrame(id, hdr, k.FrameMAC(id, hdr)); err != nil {
			b.Fatal(err)
		}
	}
}
