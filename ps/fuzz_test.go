package ps

// Fuzz tests of the gRPC handlers, called directly (no network): whatever
// a request holds, the server must not panic, a rejected request must
// leave the shard's state as it was, and the server must still answer a
// valid request afterwards. Seed corpora live in testdata/fuzz/.

import (
	"context"
	"io"
	"log/slog"
	"math"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
	"google.golang.org/protobuf/proto"
)

const (
	fuzzParams  = 6
	fuzzVersion = 3
	fuzzRun     = "run-fuzz"
)

// fuzzOptions are the shard options (InitRequest.shard_options) of a run
// of two workers in the given mode.
func fuzzOptions(mode config.Mode) *pb.ShardOptions {
	r := config.Default()
	r.LRSchedule = "constant" // the update rule under test, not the schedule
	r.Mode, r.PS, r.Workers, r.Optimizer, r.LR = mode, 1, 2, "momentum", 0.5
	return OptionsFor(r).Proto()
}

// fuzzBytes is m encoded, as FuzzInit's corpus holds shard options.
func fuzzBytes(m *pb.ShardOptions) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err) // a valid message: cannot fail
	}
	return b
}

// fuzzServer is a shard of fuzzParams parameters at version fuzzVersion,
// two workers, in the given mode.
func fuzzServer(t *testing.T, mode config.Mode) *Server {
	t.Helper()
	s := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
	params := []float32{1, -2, 3, -4, 5, -6}
	_, err := s.Init(context.Background(), &pb.InitRequest{RunId: fuzzRun, Shard: 0, NumShards: 1,
		ShardOptions: fuzzOptions(mode), Params: wire.Bytes(params), Version: fuzzVersion})
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	return s
}

type state struct {
	version  int64
	params   []float32
	opt      []float32
	optSteps int64
}

func snapshotOf(t *testing.T, s *Server) state {
	t.Helper()
	v, p, o, n, err := s.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return state{v, p, o, n}
}

func sameState(a, b state) bool {
	eq := func(x, y []float32) bool {
		return slices.EqualFunc(x, y, func(p, q float32) bool { return math.Float32bits(p) == math.Float32bits(q) })
	}
	return a.version == b.version && a.optSteps == b.optSteps && eq(a.params, b.params) && eq(a.opt, b.opt)
}

// stillServes checks that a valid push and a valid pull are answered.
func stillServes(t *testing.T, s *Server) {
	t.Helper()
	st := snapshotOf(t, s)
	for w := int32(0); w < 2; w++ {
		if _, err := s.Push(context.Background(), &pb.PushRequest{Worker: w, Version: st.version, RunId: fuzzRun,
			Grad: wire.Bytes(make([]float32, len(st.params)))}); err != nil {
			t.Fatalf("valid push from worker %d refused afterwards: %v", w, err)
		}
	}
	// A pull needing nothing newer than the current version is ready at
	// once; the cancelled context makes a wrongly blocking pull fail.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, err := s.Pull(ctx, &pb.PullRequest{Worker: -1, MinVersion: st.version, RunId: fuzzRun})
	if err != nil {
		t.Fatalf("valid pull refused afterwards: %v", err)
	}
	if got, err := wire.Floats(resp.Params); err != nil || len(got) != len(st.params) {
		t.Fatalf("pull returned %d bytes (%v), want %d parameters", len(resp.Params), err, len(st.params))
	}
}

func modeOf(b byte) config.Mode {
	return []config.Mode{config.Sync, config.Async, config.SSP}[int(b)%3]
}

func FuzzPush(f *testing.F) {
	ok := wire.Bytes([]float32{0.1, 0.2, 0.3, 0.4, 0.5, 0.6})
	f.Add(byte(0), int32(0), int64(fuzzVersion), ok, fuzzRun, float32(0.5))
	f.Add(byte(1), int32(1), int64(fuzzVersion-1), ok, "", float32(0))
	f.Add(byte(0), int32(5), int64(fuzzVersion), ok, fuzzRun, float32(0))
	f.Add(byte(2), int32(-1), int64(fuzzVersion), ok, fuzzRun, float32(0))
	f.Add(byte(0), int32(0), int64(fuzzVersion+1), ok, fuzzRun, float32(0))
	f.Add(byte(1), int32(0), int64(fuzzVersion), ok[:7], fuzzRun, float32(0))
	f.Add(byte(0), int32(0), int64(fuzzVersion), wire.Bytes([]float32{0, 0, float32(math.NaN()), 0, 0, 0}), fuzzRun, float32(0))
	f.Add(byte(1), int32(0), int64(fuzzVersion), wire.Bytes([]float32{0, 0, 0, 0, 0, float32(math.Inf(-1))}), fuzzRun, float32(0))
	f.Add(byte(0), int32(0), int64(math.MinInt64), ok, "other-run", float32(math.NaN()))
	f.Fuzz(func(t *testing.T, mode byte, worker int32, version int64, grad []byte, runID string, loss float32) {
		s := fuzzServer(t, modeOf(mode))
		before := snapshotOf(t, s)
		resp, err := s.Push(context.Background(), &pb.PushRequest{Worker: worker, Version: version, Grad: grad, RunId: runID, Loss: loss})
		after := snapshotOf(t, s)
		if err != nil {
			if !sameState(before, after) {
				t.Fatalf("rejected push (%v) changed the shard: %+v -> %+v", err, before, after)
			}
		} else {
			g, gerr := wire.Floats(grad)
			switch {
			case gerr != nil || len(g) != fuzzParams:
				t.Fatalf("accepted a gradient of %d bytes for %d parameters", len(grad), fuzzParams)
			case worker < 0 || worker >= 2:
				t.Fatalf("accepted a push from worker %d of 2", worker)
			case version > before.version:
				t.Fatalf("accepted a gradient from version %d, shard at %d", version, before.version)
			case runID != "" && runID != fuzzRun:
				t.Fatalf("accepted a push for run %q", runID)
			case slices.ContainsFunc(g, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }) &&
				!sameState(before, after):
				t.Fatalf("a non-finite gradient changed the parameters: %v", after.params)
			case resp.Outcome != pb.PushResponse_APPLIED && !sameState(before, after):
				t.Fatalf("a %v push changed the shard", resp.Outcome)
			}
			for _, p := range after.params {
				if math.IsNaN(float64(p)) || math.IsInf(float64(p), 0) {
					t.Fatalf("parameters not finite after an accepted push: %v", after.params)
				}
			}
		}
		stillServes(t, s)
	})
}

func FuzzPull(f *testing.F) {
	f.Add(byte(0), int32(0), int64(0), fuzzRun)
	f.Add(byte(0), int32(0), int64(fuzzVersion+1), fuzzRun)
	f.Add(byte(2), int32(1), int64(math.MaxInt64), "")
	f.Add(byte(2), int32(-7), int64(0), fuzzRun)
	f.Add(byte(1), int32(math.MaxInt32), int64(math.MinInt64), "stale-run")
	f.Fuzz(func(t *testing.T, mode byte, worker int32, minVersion int64, runID string) {
		s := fuzzServer(t, modeOf(mode))
		before := snapshotOf(t, s)
		// Cancelled: a pull that would block returns at once instead.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		resp, err := s.Pull(ctx, &pb.PullRequest{Worker: worker, MinVersion: minVersion, RunId: runID})
		if err == nil {
			if got, ferr := wire.Floats(resp.Params); ferr != nil || len(got) != fuzzParams || resp.Version != before.version {
				t.Fatalf("pull answered version %d with %d bytes", resp.Version, len(resp.Params))
			}
			if runID != "" && runID != fuzzRun {
				t.Fatalf("pull for run %q answered", runID)
			}
		}
		if after := snapshotOf(t, s); !sameState(before, after) {
			t.Fatalf("a pull changed the shard")
		}
		stillServes(t, s)
	})
}

func FuzzInit(f *testing.F) {
	params := wire.Bytes([]float32{1, 2, 3, 4})
	f.Add(fuzzBytes(fuzzOptions(config.Sync)), params, []byte(nil), int64(0), int64(0), int64(0), int32(0), int32(1), []byte{0, 1})
	f.Add(fuzzBytes(fuzzOptions(config.SSP)), params, wire.Bytes([]float32{0, 0, 0, 0}), int64(7), int64(9), int64(20), int32(0), int32(1), []byte(nil))
	f.Add(fuzzBytes(fuzzOptions(config.Async)), params[:5], []byte(nil), int64(0), int64(-1), int64(0), int32(0), int32(1), []byte{9})
	f.Add(fuzzBytes(&pb.ShardOptions{Mode: "sync", Replicas: 1}), params, []byte(nil), int64(-3), int64(0), int64(0), int32(-1), int32(0), []byte{})
	f.Add([]byte(`not a message`), []byte(nil), []byte{1, 2, 3}, int64(0), int64(0), int64(0), int32(3), int32(2), []byte(nil))
	f.Add(fuzzBytes(&pb.ShardOptions{Mode: "ssp", Replicas: 2, Workers: 2, Optimizer: "sgd", Lr: 1, NanPolicy: "skip", WireDtype: "bf16"}), params,
		[]byte(nil), int64(0), int64(0), int64(0), int32(0), int32(1), []byte{1})
	f.Add(fuzzBytes(&pb.ShardOptions{Mode: "sync", Replicas: 3, Workers: 2, Optimizer: "sgd", Lr: 1, NanPolicy: "reject", WireDtype: "f32"}), params,
		[]byte(nil), int64(0), int64(0), int64(0), int32(0), int32(1), []byte(nil))
	f.Add(fuzzBytes(&pb.ShardOptions{Mode: "async", Replicas: 1, Workers: 1, Optimizer: "sgd", Lr: 1, NanPolicy: "drop", WireDtype: "f32"}), params,
		[]byte(nil), int64(0), int64(0), int64(0), int32(0), int32(1), []byte(nil))
	// A shard keeps state per worker slot: a count near MaxInt32 once
	// hung the fuzzer allocating it.
	f.Add(fuzzBytes(&pb.ShardOptions{Mode: "sync", Replicas: 1, Workers: math.MaxInt32, Optimizer: "sgd", Lr: 1, NanPolicy: "reject", WireDtype: "f32"}), params,
		[]byte(nil), int64(0), int64(0), int64(0), int32(0), int32(1), []byte(nil))
	f.Fuzz(func(t *testing.T, shardOptions, params, optState []byte, optStep, version, maxVersion int64, shard, numShards int32, live []byte) {
		s := fuzzServer(t, config.Sync)
		before := snapshotOf(t, s)
		var lw []int32
		for _, b := range live {
			lw = append(lw, int32(int8(b)))
		}
		var opts *pb.ShardOptions // bytes that are no message: no options
		if m := new(pb.ShardOptions); proto.Unmarshal(shardOptions, m) == nil {
			opts = m
		}
		_, err := s.Init(context.Background(), &pb.InitRequest{RunId: fuzzRun, ShardOptions: opts, Params: params,
			OptimizerState: optState, OptimizerStep: optStep, Version: version, MaxVersion: maxVersion,
			Shard: shard, NumShards: numShards, LiveWorkers: lw})
		if err != nil {
			if after := snapshotOf(t, s); !sameState(before, after) {
				t.Fatalf("rejected init (%v) changed the shard", err)
			}
			stillServes(t, s)
			return
		}
		after := snapshotOf(t, s)
		if want, _ := wire.Floats(params); len(after.params) != len(want) || after.version != version {
			t.Fatalf("init accepted: %d params at version %d, want %d at %d", len(after.params), after.version, len(want), version)
		}
		// Whatever the new configuration, reading the state must not panic
		// and a status must be answered.
		if _, err := s.Status(context.Background(), &pb.StatusRequest{}); err != nil {
			t.Fatalf("status after init: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _ = s.Pull(ctx, &pb.PullRequest{Worker: 0, MinVersion: version, RunId: fuzzRun})
		_, _ = s.Push(context.Background(), &pb.PushRequest{Worker: 0, Version: version, RunId: fuzzRun, Grad: make([]byte, len(params))})
	})
}

// fuzzIndices reads worker indices from b, one a byte: the byte as a
// signed number, or, from 0xf0 up, one of the 16 indices below 2^31
// (garbage that must not size the shard's state).
func fuzzIndices(b []byte) []int32 {
	var out []int32
	for _, x := range b {
		if x >= 0xf0 {
			out = append(out, math.MaxInt32-int32(0xff-x))
			continue
		}
		out = append(out, int32(int8(x)))
	}
	return out
}

// FuzzSetMembership: whatever a membership holds, the server does not
// panic, keeps state for at most config.MaxWorkerSlots workers (and room
// for as many gradients), leaves the shard as it was when it refuses one,
// and still answers a status, a pull and a push afterwards.
func FuzzSetMembership(f *testing.F) {
	f.Add(byte(0), []byte{0, 1}, int32(0), []byte(nil), int32(0), []byte(nil), int64(0), int64(0))
	f.Add(byte(4), []byte{0, 1, 2}, int32(3), []byte{2}, int32(3), []byte{1}, int64(fuzzVersion+2), int64(100))
	f.Add(byte(1), []byte{0, 1}, int32(0), []byte{0}, int32(0), []byte(nil), int64(fuzzVersion), int64(fuzzVersion))
	f.Add(byte(2), []byte{0xff}, int32(2), []byte(nil), int32(1), []byte{0xfe, 0x80}, int64(0), int64(-1))
	// A count or an index past config.MaxWorkerSlots, near 2^31, once had
	// the shard allocate tens of gigabytes of per-worker state, or of
	// room for gradients.
	f.Add(byte(0), []byte{0, 1}, int32(config.MaxWorkerSlots+1), []byte(nil), int32(0), []byte(nil), int64(0), int64(0))
	f.Add(byte(4), []byte{0, 1}, int32(0), []byte(nil), int32(config.MaxWorkerSlots+1), []byte(nil), int64(0), int64(0))
	f.Add(byte(0), []byte{0, 1}, int32(math.MaxInt32), []byte(nil), int32(0), []byte(nil), int64(0), int64(0))
	f.Add(byte(4), []byte{0, 1}, int32(0), []byte(nil), int32(math.MaxInt32), []byte(nil), int64(0), int64(0))
	f.Add(byte(0), []byte{0, 1}, int32(0), []byte{0xff}, int32(0), []byte(nil), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, mode byte, live []byte, members int32, retired []byte, replicas int32, quarantined []byte, holdAt, maxVersion int64) {
		var s *Server
		if mode&4 != 0 { // sync with a trimmed mean: room kept per replica
			s = trimmedServer(t)
		} else {
			s = fuzzServer(t, modeOf(mode))
		}
		before, slots := snapshotOf(t, s), s.shard.Slots()
		_, err := s.SetMembership(context.Background(), &pb.MembershipRequest{LiveWorkers: fuzzIndices(live), Members: members,
			Retired: fuzzIndices(retired), Replicas: replicas, Quarantined: fuzzIndices(quarantined), HoldAt: holdAt, MaxVersion: maxVersion})
		if err != nil && (!sameState(before, snapshotOf(t, s)) || s.shard.Slots() != slots) {
			t.Fatalf("a refused membership (%v) changed the shard", err)
		}
		if s.shard.Slots() > config.MaxWorkerSlots || len(s.shard.kept) > config.MaxWorkerSlots {
			t.Fatalf("state for %d workers and %d gradients after members %d, replicas %d", s.shard.Slots(), len(s.shard.kept), members, replicas)
		}
		if _, err := s.Status(context.Background(), &pb.StatusRequest{}); err != nil {
			t.Fatalf("status: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		v := s.shard.Version()
		_, _ = s.Pull(ctx, &pb.PullRequest{Worker: 0, MinVersion: v, RunId: fuzzRun})
		_, _ = s.Push(context.Background(), &pb.PushRequest{Worker: 1, Version: v, RunId: fuzzRun, Grad: wire.Bytes(make([]float32, fuzzParams))})
	})
}

// trimmedServer is fuzzServer's shard of two sync workers whose steps
// take the trimmed mean of their gradients.
func trimmedServer(t *testing.T) *Server {
	t.Helper()
	s := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
	opts := fuzzOptions(config.Sync)
	opts.Aggregate = string(config.TrimmedMean)
	_, err := s.Init(context.Background(), &pb.InitRequest{RunId: fuzzRun, Shard: 0, NumShards: 1,
		ShardOptions: opts, Params: wire.Bytes([]float32{1, -2, 3, -4, 5, -6}), Version: fuzzVersion})
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	return s
}
