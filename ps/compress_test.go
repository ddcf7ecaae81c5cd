package ps

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/compress"
	"github.com/pstrain/pstrain/transport/wire"
)

// A run with --compress int8 takes pushes of the codec's length and
// applies what they decode to; other lengths, and payloads the codec
// never writes, are refused as bad input and change nothing.
func TestCompressedPushesAreDecodedOrRefused(t *testing.T) {
	srv, _, n := newTestServer(t, 0, func(r *config.Run) {
		r.Workers, r.PS, r.Optimizer, r.LR, r.Compress = 1, 1, "sgd", 1, "int8"
	})
	codec := compress.Spec{Kind: compress.Int8}.Codec()
	g := make([]float32, n)
	for i := range g {
		g[i] = 1 + float32(i)/1000
	}
	malformed := make([]byte, codec.EncodedLen(n))
	malformed[1] = 0x80 // -128: no int8 encoder writes it
	for _, bad := range [][]byte{wire.Bytes(g), make([]byte, codec.EncodedLen(n)+1), malformed} {
		_, err := srv.Push(context.Background(), &pb.PushRequest{Grad: bad, RunId: "r"})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a push of %d bytes for %d values: %v, want InvalidArgument", len(bad), n, err)
		}
	}
	payload, err := compress.NewFeedback(codec, n).Encode(nil, [][]float32{g})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Push(context.Background(), &pb.PushRequest{Grad: payload, RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	_, params, _, _, err := srv.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dec := make([]float32, n)
	if err := codec.Decode(dec, payload); err != nil {
		t.Fatal(err)
	}
	for i := range params {
		if params[i] != -dec[i] {
			t.Fatalf("param %d = %v after one sgd step at lr 1, want %v", i, params[i], -dec[i])
		}
	}
}

// Under --compress, a worker's pull that asks for a delta is answered
// whole first, then with deltas its replica applies, which bring it to
// the parameters; a pull with a base the shard did not answer last is
// answered whole, and a pull that asks for no delta (the chief's) gets
// the parameters as float32.
func TestCompressedPullsAreDeltasFromWhatTheWorkerHolds(t *testing.T) {
	srv, _, n := newTestServer(t, 0, func(r *config.Run) {
		r.Workers, r.PS, r.Optimizer, r.LR, r.Compress = 1, 1, "sgd", 1, "topk:0.5"
	})
	codec := compress.Spec{Kind: compress.TopK, Fraction: 0.5}.Codec()
	rep := compress.NewReplica(codec, n)
	pull := func(base int64) []byte {
		resp, err := srv.Pull(context.Background(), &pb.PullRequest{Worker: 0, RunId: "r", Delta: true, DeltaBase: base})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Params
	}
	if err := rep.Apply(pull(rep.Base())); err != nil {
		t.Fatal(err)
	}
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(i%7) - 3
	}
	payload, _ := compress.NewFeedback(codec, n).Encode(nil, [][]float32{g})
	if _, err := srv.Push(context.Background(), &pb.PushRequest{Grad: payload, RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	_, params, _, _, _ := srv.Snapshot()
	if slices.Equal(rep.Values(), params) {
		t.Fatal("the push changed nothing")
	}
	for k := range 2 { // top-k of half the values: two deltas send every change
		ans := pull(rep.Base())
		if kind := ans[16]; kind != 1 || len(ans) != 17+codec.EncodedLen(n) {
			t.Fatalf("pull %d: answer kind %d of %d bytes, want a delta of %d", k, kind, len(ans), 17+codec.EncodedLen(n))
		}
		if err := rep.Apply(ans); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(rep.Values(), params) {
		t.Fatalf("after two deltas the replica is not the parameters:\n%v\n%v", rep.Values(), params)
	}
	if ans := pull(rep.Base() + 1); ans[16] != 0 {
		t.Fatal("a pull with a base the shard never answered got a delta")
	}
	resp, err := srv.Pull(context.Background(), &pb.PullRequest{Worker: -1, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := wire.Floats(resp.Params); !slices.Equal(got, params) {
		t.Fatal("a pull without delta did not get the parameters as float32")
	}
}
