package ps

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/ml/vec"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// separate hides its optimizer's type, so that optim.Step and StepSum
// take the separate passes (add into the attribution sum, apply, copy)
// instead of the momentum optimizer's fused one: the reference a fused
// shard must match.
type separate struct{ optim.Optimizer }

// A shard whose updates take one fused pass (the gradient into its
// worker's attribution sum, the momentum update, the new parameters into
// the server's snapshot) ends every push bit for bit where a shard taking
// the separate passes does: parameters, momentum, attribution windows,
// and the snapshot written at each advance equal to the parameters. Over
// random gradients of every magnitude, 1 to 3 workers, sync and async,
// a learning-rate schedule, and the norm guard refusing the huge ones
// once it has warmed up (refused gradients never reach the sums).
func TestFusedShardIsTheSeparatePasses(t *testing.T) {
	const n = 16*5 + 9 // whole blocks and a tail
	for _, mode := range []config.Mode{config.Sync, config.Async} {
		for workers := 1; workers <= 3; workers++ {
			r := rand.New(rand.NewPCG(uint64(workers), 31))
			sched, err := optim.NewLRSchedule(0.05, optim.Schedule{Kind: optim.Cosine}, 5, 0, 400)
			if err != nil {
				t.Fatal(err)
			}
			cfg := ShardConfig{Mode: mode, Replicas: workers, Workers: workers, NormGuard: 4, LR: sched}
			init := randGrad(r, n, 1)
			fused, ref := newMomentumShard(t, cfg, init, false), newMomentumShard(t, cfg, init, true)
			refused := 0
			sums := newWindowSums(workers, fused.Params())
			for step := range 200 {
				for w := range workers {
					g := randGrad(r, n, 1e-2)
					if r.IntN(10) == 0 {
						g = randGrad(r, n, 1e3) // for the guard to refuse
					}
					out := randGrad(r, n, 1) // the snapshot buffer, with stale values
					before := slices.Clone(out)
					fr, ferr := fused.Take(Gradient{Worker: w, Version: fused.Version(), Values: slices.Clone(g), After: int64(step + 1), Out: out,
						SumSquares: vec.SumSquares(g), Squared: step%2 == 0})
					rr, rerr := ref.PushAt(w, ref.Version(), slices.Clone(g), int64(step+1))
					rr.Wrote = rr.Advanced // (the fused push writes its snapshot when it advances)
					if ferr != nil || rerr != nil || fr != rr {
						t.Fatalf("%s, %d workers, step %d: fused %+v %v, separate %+v %v", mode, workers, step, fr, ferr, rr, rerr)
					}
					switch fr.Outcome {
					case Refused:
						refused++
					case Applied:
						sums.add(w, g)
					}
					if fr.Advanced {
						sameFloats(t, "the snapshot", out, fused.Params())
					} else {
						sameFloats(t, "the snapshot of a push that did not advance", out, before)
					}
					sameFloats(t, "parameters", fused.Params(), ref.Params())
				}
				fs, _ := fused.Optimizer().State()
				rs, _ := ref.Optimizer().State()
				sameFloats(t, "momentum", fs, rs)
				if step%40 == 39 {
					want := sums.close(fused.Params())
					fw, rw := fused.CloseWindow(), ref.CloseWindow()
					if !sameWindow(fw, rw) || !sameFigures(fw, want) {
						t.Fatalf("%s, %d workers: attribution window %+v, separately %+v, summed here %+v", mode, workers, fw, rw, want)
					}
				}
			}
			if refused == 0 {
				t.Fatalf("%s, %d workers: the guard refused nothing: its path went untested", mode, workers)
			}
		}
	}
}

func newMomentumShard(t *testing.T, cfg ShardConfig, init []float32, sep bool) *Shard {
	t.Helper()
	opt, err := optim.New(optim.Config{Name: "momentum", LR: 0.05, Momentum: 0.9}, len(init))
	if err != nil {
		t.Fatal(err)
	}
	if sep {
		opt = separate{opt}
	}
	s, err := NewShard(cfg, slices.Clone(init), opt, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func randGrad(r *rand.Rand, n int, scale float64) []float32 {
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(r.NormFloat64() * scale)
	}
	return g
}

func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

func sameWindow(a, b Window) bool {
	bits := func(x []float64) []uint64 {
		out := make([]uint64, len(x))
		for i, v := range x {
			out[i] = math.Float64bits(v)
		}
		return out
	}
	return a.From == b.From && a.To == b.To && math.Float64bits(a.UpdateSq) == math.Float64bits(b.UpdateSq) &&
		slices.Equal(bits(a.Dot), bits(b.Dot)) && slices.Equal(bits(a.Sq), bits(b.Sq))
}

// windowSums is the test's own attribution: each worker's accepted
// gradients summed in float32 in the order they were pushed, and the
// window's figures as Agreement.Close defines them.
type windowSums struct {
	sums [][]float32
	mark []float32
}

func newWindowSums(workers int, params []float32) *windowSums {
	w := &windowSums{sums: make([][]float32, workers), mark: slices.Clone(params)}
	for i := range w.sums {
		w.sums[i] = make([]float32, len(params))
	}
	return w
}

func (w *windowSums) add(worker int, g []float32) {
	for i, x := range g {
		w.sums[worker][i] += x
	}
}

func (w *windowSums) close(params []float32) Window {
	win := Window{Dot: make([]float64, len(w.sums)), Sq: make([]float64, len(w.sums))}
	for i, p := range params {
		d := float64(w.mark[i] - p)
		win.UpdateSq += d * d
	}
	for k, s := range w.sums {
		for i, v := range s {
			win.Dot[k] += float64(v) * float64(w.mark[i]-params[i])
			win.Sq[k] += float64(v) * float64(v)
		}
		clear(s)
	}
	copy(w.mark, params)
	return win
}

// sameFigures is sameWindow without the versions.
func sameFigures(a, b Window) bool {
	b.From, b.To = a.From, a.To
	return sameWindow(a, b)
}

// The push that completes a sync step leaves the new version's pull
// snapshot written (in the update's pass: no pull copies it), and a pull
// gets the parameters bit for bit, step after step.
func TestStepWritesThePullSnapshot(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	r := rand.New(rand.NewPCG(3, 5))
	ctx := context.Background()
	for v := range int64(20) {
		for w := range int32(2) {
			g := randGrad(r, n, 0.1)
			if _, err := srv.Push(ctx, &pb.PushRequest{Worker: w, Version: v, Grad: wire.Bytes(g), RunId: "r", Generation: 1}); err != nil {
				t.Fatal(err)
			}
		}
		srv.mu.Lock()
		written := srv.snap != nil && srv.snap.version == v+1
		srv.mu.Unlock()
		if !written {
			t.Fatalf("no snapshot of version %d after the step's last push", v+1)
		}
		resp, release := pullShared(t, srv, v+1)
		// (The shard's own parameters: Snapshot would read the very
		// snapshot under test.)
		if !slices.Equal(resp.Params, shardParams(srv)) {
			t.Fatalf("version %d's pull is not its parameters", v+1)
		}
		release()
	}
}

// A gradient's sum of squares, when the caller gives it, is the one the
// shard judges by (its norm, and whether it is finite): it takes no pass
// of its own over the values.
func TestTakeJudgesByTheGivenSumOfSquares(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 1, Workers: 1}, 3)
	g := []float32{1, 2, 2}
	res, err := s.Take(Gradient{Worker: 0, Version: 0, Values: g, SumSquares: 16, Squared: true})
	if err != nil || res.Norm != 4 || !res.Advanced {
		t.Fatalf("given 16: %+v %v, want norm 4 and the step applied", res, err)
	}
	if _, err := s.Take(Gradient{Worker: 0, Version: 1, Values: g, SumSquares: math.NaN(), Squared: true}); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("given NaN: %v, want ErrNonFinite", err)
	}
	if res, err := s.Take(Gradient{Worker: 0, Version: 1, Values: g}); err != nil || res.Norm != 3 {
		t.Fatalf("given none: %+v %v, want norm 3", res, err)
	}
}

// shardParams is a copy of srv's shard's parameters as bytes, read
// under its lock: what a pull of its version must hold.
func shardParams(srv *Server) []byte {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return slices.Clone(wire.Bytes(srv.shard.Params()))
}
