package ps

// A count or an index in a request sizes what the shard allocates (state
// per worker slot, the trimmed mean's room per replica, a plan's shards,
// a table's rows): each is bounded before it is used, so that a request
// of garbage is refused instead of having the PS ask for gigabytes. Each
// case is one past its bound first (accepted before the bound existed,
// cheaply), then the garbage value near 2^31 that motivated it.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"runtime"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

func TestMembershipBoundsWorkerSlots(t *testing.T) {
	const most = config.MaxWorkerSlots
	for _, huge := range []int{most, math.MaxInt32} {
		for name, m := range map[string]Membership{
			"members":     {Live: []int{0, 1}, Members: huge + 1},
			"replicas":    {Live: []int{0, 1}, Replicas: huge + 1},
			"retired":     {Live: []int{0, 1}, Retired: []int{huge}},
			"quarantined": {Live: []int{0, 1}, Quarantined: []int{0, huge}},
		} {
			s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2, Aggregate: config.TrimmedMean}, 3)
			if _, err := s.SetMembership(m); !errors.Is(err, ErrBadMembership) {
				t.Fatalf("%s %d: %v, want ErrBadMembership", name, huge, err)
			}
			if s.Slots() != 2 || len(s.kept) != 2 || s.Retired(0) || s.Quarantined(0) {
				t.Fatalf("%s %d: a refused membership changed the shard (%d slots, room for %d gradients)", name, huge, s.Slots(), len(s.kept))
			}
		}
	}
	// The bound itself is a run's most workers: accepted.
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 3)
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}, Members: most, Retired: []int{most - 1}, Replicas: 2}); err != nil {
		t.Fatalf("a membership of %d slots: %v", most, err)
	}
	if s.Slots() != most || !s.Retired(most-1) {
		t.Fatalf("%d slots, worker %d retired %v; want %d slots, retired", s.Slots(), most-1, s.Retired(most-1), most)
	}
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A trimmed mean keeps each of a step's gradients: its room is made as
// gradients arrive, not for every replica an Init or a membership names
// (4096 of them, each the shard's size).
func TestTrimmedMeanRoomFollowsGradients(t *testing.T) {
	const n, most = 1 << 14, config.MaxWorkerSlots // 64 KiB a gradient
	opt, err := optim.New(optim.Config{Name: "sgd", LR: 1}, n)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ShardConfig{Mode: config.Sync, Replicas: most, Workers: most, Aggregate: config.TrimmedMean}
	var s *Shard
	if b := allocated(func() { s, err = NewShard(cfg, make([]float32, n), opt, 0) }); err != nil || b > 4<<20 {
		t.Fatalf("a shard of %d replicas allocated %d bytes (%v), want the per-worker state alone", most, b, err)
	}
	s = newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 3, Workers: 3, Aggregate: config.TrimmedMean}, n)
	if b := allocated(func() { _, err = s.SetMembership(Membership{Live: []int{0, 1, 2}, Members: most, Replicas: most}) }); err != nil || b > 4<<20 {
		t.Fatalf("a membership of %d replicas allocated %d bytes (%v)", most, b, err)
	}
	// The room is still there when the gradients come: a step of three
	// (the middle value of each coordinate) as before.
	s = newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 3, Workers: 3, Aggregate: config.TrimmedMean}, 2)
	for w, g := range [][]float32{{1, 30}, {2, 10}, {3, 20}} {
		if _, err := s.Push(w, 0, g); err != nil {
			t.Fatal(err)
		}
	}
	if p := s.Params(); s.Version() != 1 || p[0] != -2 || p[1] != -20 {
		t.Fatalf("version %d, params %v after a trimmed mean of three at lr 1; want 1, [-2 -20]", s.Version(), p)
	}
}

// The RPC answers a membership out of range as the request's error.
func TestSetMembershipRPCRefusesGarbage(t *testing.T) {
	s := fuzzServer(t, config.Sync)
	before := snapshotOf(t, s)
	_, err := s.SetMembership(context.Background(), &pb.MembershipRequest{LiveWorkers: []int32{0, 1}, Members: math.MaxInt32})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("members 2^31-1: %v, want InvalidArgument", err)
	}
	if after := snapshotOf(t, s); !sameState(before, after) {
		t.Fatal("a refused membership changed the shard")
	}
	stillServes(t, s)
}

func TestShardStateBoundsWorkerSlots(t *testing.T) {
	cfg := ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2, Aggregate: config.TrimmedMean}
	src := newStateShard(t, cfg, "sgd", make([]float32, 4))
	wide := src.State()
	n := config.MaxWorkerSlots + 1
	wide.Live, wide.Retired, wide.Quarantined = make([]bool, n), make([]bool, n), make([]bool, n)
	wide.Refused, wide.NonFinite, wide.Clock, wide.Pos = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	many := src.State()
	many.Replicas = config.MaxWorkerSlots + 1
	for name, st := range map[string]ShardState{"workers": wide, "replicas": many} {
		s := newStateShard(t, cfg, "sgd", make([]float32, 4))
		if err := s.SetState(st); err == nil {
			t.Fatalf("a shard state of %s past %d accepted", name, config.MaxWorkerSlots)
		}
		if s.Slots() != 2 || len(s.kept) != 2 {
			t.Fatalf("%s: a refused state grew the shard to %d slots, room for %d gradients", name, s.Slots(), len(s.kept))
		}
	}
}

// boundsInit is an Init of a two-worker sync run's one shard of a small
// MLP, which edit changes.
func boundsInit(edit func(*pb.InitRequest)) *pb.InitRequest {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	req := &pb.InitRequest{RunId: fuzzRun, NumShards: 1, ShardOptions: fuzzOptions(config.Sync), Generation: 1,
		Params: wire.Bytes(make([]float32, spec.NumParams())), ModelSpec: convert.ModelSpec(spec), StepsPerEpoch: 10}
	edit(req)
	return req
}

func TestInitBoundsCounts(t *testing.T) {
	table := func(dim int32) []*pb.TableSpec {
		return []*pb.TableSpec{{Name: "emb/C1", Dim: dim, Seed: 1, Rule: string(embed.SGD), Lr: 1, PrefillRows: 1}}
	}
	cases := []struct {
		name string
		edit func(*pb.InitRequest)
	}{
		{"data positions", func(r *pb.InitRequest) {
			r.DataPositions, r.DataSlots = make([]int64, config.MaxWorkerSlots+1), config.MaxWorkerSlots+1
		}},
		{"table dimension", func(r *pb.InitRequest) { r.Tables = table(config.MaxEmbeddingDim + 1) }},
		{"table dimension 2^31-1", func(r *pb.InitRequest) { r.Tables = table(math.MaxInt32) }},
		{"shards 2^31-1", func(r *pb.InitRequest) { r.NumShards = math.MaxInt32 }},
		{"layers of 2^31-1", func(r *pb.InitRequest) {
			r.ModelSpec = convert.ModelSpec(model.Spec{Input: math.MaxInt32, Hidden: []int{math.MaxInt32, math.MaxInt32}, Classes: 2})
		}},
	}
	for _, c := range cases {
		s := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
		if _, err := s.Init(context.Background(), boundsInit(c.edit)); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want InvalidArgument", c.name, err)
		}
	}
	// The bounds themselves are accepted.
	s := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
	if _, err := s.Init(context.Background(), boundsInit(func(r *pb.InitRequest) {
		r.DataPositions, r.DataSlots = make([]int64, config.MaxWorkerSlots), config.MaxWorkerSlots
		r.Tables = table(config.MaxEmbeddingDim)
	})); err != nil {
		t.Fatalf("an init at the bounds: %v", err)
	}
}
