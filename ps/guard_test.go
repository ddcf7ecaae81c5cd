package ps

import (
	"context"
	"io"
	"log/slog"
	"math"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// feed has g judge each norm and accept those it does not refuse, as a
// shard does, and returns the verdicts.
func feed(g *NormGuard, norms ...float64) []Verdict {
	var out []Verdict
	for _, n := range norms {
		v := g.Judge(n)
		if !v.Refuse {
			g.Accept(n)
		}
		out = append(out, v)
	}
	return out
}

func repeat(x float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = x
	}
	return out
}

func TestNormGuardWarmsUpThenRefusesBeyondK(t *testing.T) {
	g := NewNormGuard(20, 1e-3)
	// Warm-up: nothing is judged before GuardWindow norms are known,
	// however large.
	warm := append(repeat(1, GuardWindow-1), 1e9)
	for i, v := range feed(g, warm...) {
		if v.Refuse || v.Ratio != 0 {
			t.Fatalf("norm %d of the warm-up judged: %+v", i, v)
		}
	}
	// The window is now 31 ones and 1e9: the median is 1.
	if r := g.Reference(); r != 1 {
		t.Fatalf("reference %v after the warm-up, want the median 1", r)
	}
	for _, c := range []struct {
		norm   float64
		refuse bool
	}{{19.9, false}, {20, false}, {20.01, true}, {1e6, true}, {0.5, false}} {
		v := g.Judge(c.norm)
		if v.Refuse != c.refuse || math.Abs(v.Ratio-c.norm) > 1e-12 {
			t.Errorf("norm %v: %+v, want refuse=%t ratio=%v", c.norm, v, c.refuse, c.norm)
		}
	}
	// Judge changes nothing: the same norm gets the same verdict.
	if a, b := g.Judge(25), g.Judge(25); a != b {
		t.Errorf("judging twice: %+v then %+v", a, b)
	}
}

// The median follows the accepted norms (norms that shrink as training
// converges move the limit down), and refused ones never enter it: a
// stream of huge gradients cannot drag the limit up.
func TestNormGuardMedianFollowsAcceptedOnly(t *testing.T) {
	g := NewNormGuard(10, 1e-6)
	feed(g, repeat(1, GuardWindow)...)
	for i, v := range feed(g, repeat(1000, 100)...) {
		if !v.Refuse {
			t.Fatalf("huge gradient %d accepted: %+v (reference %v)", i, v, g.Reference())
		}
	}
	if g.Reference() != 1 {
		t.Fatalf("refused norms moved the reference to %v", g.Reference())
	}
	// Norms halve: after half a window the median is the new level.
	feed(g, repeat(0.5, GuardWindow/2+1)...)
	if g.Reference() != 0.5 {
		t.Fatalf("reference %v after a window of 0.5s, want 0.5", g.Reference())
	}
	if v := g.Judge(6); !v.Refuse || v.Ratio != 12 {
		t.Errorf("norm 6 against reference 0.5: %+v, want refused at ratio 12", v)
	}
	// A minority of outliers (a third of the window, each under K) does
	// not move the median.
	g = NewNormGuard(10, 1e-6)
	var mixed []float64
	for i := range GuardWindow {
		if i%3 == 0 {
			mixed = append(mixed, 8)
		} else {
			mixed = append(mixed, 1)
		}
	}
	feed(g, mixed...)
	if g.Reference() != 1 {
		t.Errorf("reference %v with a third of the window at 8, want 1", g.Reference())
	}
}

// The floor: tiny early norms do not make ordinary ones look huge.
func TestNormGuardFloor(t *testing.T) {
	g := NewNormGuard(20, 0.01)
	feed(g, repeat(1e-6, GuardWindow)...)
	if g.Reference() != 0.01 {
		t.Fatalf("reference %v, want the floor 0.01", g.Reference())
	}
	if v := g.Judge(0.15); v.Refuse || v.Ratio != 15 {
		t.Errorf("norm 0.15 over a floor of 0.01: %+v, want ratio 15, accepted", v)
	}
	if v := g.Judge(0.5); !v.Refuse {
		t.Errorf("norm 0.5 over a floor of 0.01 (x50): %+v, want refused", v)
	}
}

// K = 0 judges (the ratios still name outliers) but never refuses.
func TestNormGuardOff(t *testing.T) {
	g := NewNormGuard(0, 1e-6)
	vs := feed(g, append(repeat(1, GuardWindow), 1e12)...)
	if v := vs[len(vs)-1]; v.Refuse || v.Ratio != 1e12 {
		t.Errorf("guard off: %+v, want ratio 1e12 and no refusal", v)
	}
}

func TestSumSquares(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 5, 9} {
		x := make([]float32, n)
		want := 0.0
		for i := range x {
			x[i] = float32(i) - 2.5
			want += float64(x[i]) * float64(x[i])
		}
		if got := sumSquares(x); got != want {
			t.Errorf("n=%d: %v, want %v", n, got, want)
		}
	}
	big := []float32{math.MaxFloat32, math.MaxFloat32, -math.MaxFloat32}
	if got := sumSquares(big); !isFinite(got) {
		t.Errorf("squares of the largest float32s overflowed: %v", got)
	}
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	for _, x := range [][]float32{{1, inf}, {-inf}, {2, 3, 4, nan, 5}} {
		if got := sumSquares(x); isFinite(got) {
			t.Errorf("%v: %v is finite", x, got)
		}
	}
}

func TestTrimmedMeanExact(t *testing.T) {
	cases := []struct {
		name  string
		grads [][]float32
		want  []float32
	}{
		{"one: itself", [][]float32{{1, -2}}, []float32{1, -2}},
		{"two: the mean", [][]float32{{1, -2}, {3, 4}}, []float32{2, 1}},
		{"three: the median", [][]float32{{1, 9, -5}, {2, 8, 100}, {3, 7, 0}}, []float32{2, 8, 0}},
		// Per coordinate: a different gradient holds the extremes in each.
		{"four", [][]float32{{1, 40, 0}, {2, 10, 0}, {3, 20, 0}, {100, 30, 0}}, []float32{2.5, 25, 0}},
		// Equal values are dropped once each.
		{"ties", [][]float32{{1}, {1}, {1}, {5}}, []float32{1}},
		{"all equal", [][]float32{{7}, {7}, {7}, {7}, {7}}, []float32{7}},
		// A huge value is dropped, never added: the others keep their
		// precision.
		{"huge", [][]float32{{1e-3}, {2e-3}, {3e-3}, {3e38}}, []float32{2.5e-3}},
		{"huge negative", [][]float32{{-3e38}, {1e-3}, {2e-3}, {3e-3}, {3e38}}, []float32{2e-3}},
	}
	for _, c := range cases {
		dst := make([]float32, len(c.want))
		TrimmedMean(dst, c.grads)
		for i := range dst {
			if math.Abs(float64(dst[i]-c.want[i])) > 1e-9 {
				t.Errorf("%s: %v, want %v", c.name, dst, c.want)
				break
			}
		}
	}
}

// syncShard is a sync shard of n parameters (sgd, lr 1) for w workers
// aggregating r gradients a step, with the norm guard at k.
func syncShard(t *testing.T, w, r, n int, k float64, agg config.Aggregate) *Shard {
	t.Helper()
	return newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: r, Workers: w, NormGuard: k, Aggregate: agg}, n)
}

// warm pushes GuardWindow steps of gradient g from every worker.
func warm(t *testing.T, s *Shard, workers int, g []float32) {
	t.Helper()
	for range GuardWindow {
		for w := range workers {
			if _, err := s.Push(w, s.Version(), g); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A refused gradient in a sync step counts as arrived (the step does not
// wait for another from that worker) but is left out of the mean, as if
// its worker had died after pushing; its batch is used up.
func TestSyncRefusedGradientIsLeftOutOfTheStep(t *testing.T) {
	s := syncShard(t, 3, 3, 2, 20, config.Mean)
	warm(t, s, 3, grad(1, 0))
	v := s.Version()
	p0 := slices.Clone(s.Params())
	if r, _ := s.PushAt(0, v, grad(2, 0), 101); r.Outcome != Applied || r.Advanced {
		t.Fatalf("honest gradient: %+v", r)
	}
	r, err := s.PushAt(1, v, grad(1e6, 0), 202)
	if err != nil || r.Outcome != Refused || r.Advanced || r.Ratio < 1e5 {
		t.Fatalf("huge gradient: %+v, %v; want refused", r, err)
	}
	if r, _ := s.PushAt(1, v, grad(1, 0), 203); r.Outcome != Duplicate {
		t.Fatalf("the refused worker's second gradient for the step: %+v, want a duplicate", r)
	}
	r, _ = s.PushAt(2, v, grad(4, 0), 303)
	if !r.Advanced || s.Version() != v+1 {
		t.Fatalf("the third arrival must complete the step: %+v, version %d", r, s.Version())
	}
	// The mean of the two accepted gradients, (2+4)/2 = 3, at lr 1.
	if got := s.Params()[0]; got != p0[0]-3 {
		t.Errorf("param %v, want %v: the step must apply the mean of the accepted gradients only", got, p0[0]-3)
	}
	if pos := s.DataPositions(); pos[0] != 101 || pos[1] != 202 || pos[2] != 303 {
		t.Errorf("data positions %v: the refused gradient's batch must be used up too", pos)
	}
	if ref := s.Refused(); !slices.Equal(ref, []int64{0, 1, 0}) {
		t.Errorf("refused by worker %v, want [0 1 0]", ref)
	}
	if o := s.Outlier(); o == nil || o.Worker != 1 || o.Version != v {
		t.Errorf("first outlier %+v, want worker 1 at version %d", o, v)
	}
	if st := s.Stats(); st.Refused != 1 || st.MaxRatioWorker != 1 {
		t.Errorf("stats %+v", st)
	}

	// Every gradient of a step refused: the version moves on (no worker
	// waits for ever) and no parameter changes.
	v, p1 := s.Version(), slices.Clone(s.Params())
	for w := range 3 {
		if r, _ := s.Push(w, v, grad(-1e7, 5)); r.Outcome != Refused {
			t.Fatalf("worker %d: %+v", w, r)
		}
	}
	if s.Version() != v+1 || !slices.Equal(s.Params(), p1) {
		t.Errorf("all refused: version %d (want %d), params %v (want %v)", s.Version(), v+1, s.Params(), p1)
	}

	// The last gradient arrives while a worker is dead: SetLive completes
	// the step with the accepted one only.
	v = s.Version()
	p2 := slices.Clone(s.Params())
	s.Push(0, v, grad(-3e7, 0)) // refused
	s.Push(1, v, grad(2, 0))
	if !s.SetLive([]int{0, 1}) || s.Version() != v+1 || s.Params()[0] != p2[0]-2 {
		t.Errorf("membership change: version %d, param %v, want %d and %v", s.Version(), s.Params()[0], v+1, p2[0]-2)
	}
}

// Async and ssp: a refused gradient changes no parameter and no version;
// the worker's clock and data position move on (an ssp worker whose
// gradients are all refused must not stall the others).
func TestAsyncRefusedGradient(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.SSP, Workers: 2, Staleness: 1, NormGuard: 20}, 1)
	for range GuardWindow {
		s.Push(0, s.Version(), grad(1))
	}
	v, p, c := s.Version(), s.Params()[0], s.Clock(1)
	r, err := s.PushAt(1, v, grad(1e5), 9)
	if err != nil || r.Outcome != Refused || r.Advanced {
		t.Fatalf("huge gradient: %+v, %v", r, err)
	}
	if s.Version() != v || s.Params()[0] != p || s.Clock(1) != c+1 || s.DataPosition(1) != 9 {
		t.Errorf("after a refusal: version %d param %v clock %d position %d; want %d %v %d 9",
			s.Version(), s.Params()[0], s.Clock(1), s.DataPosition(1), v, p, c+1)
	}
}

// Non-finite gradients are refused with ErrNonFinite, as before, and now
// also counted against their worker, apart from the norm guard's
// refusals; they are not outliers (never applied, they cannot be what
// made a model diverge).
func TestNonFiniteCountsAgainstTheWorker(t *testing.T) {
	s := syncShard(t, 2, 2, 2, 20, config.Mean)
	nan := float32(math.NaN())
	if _, err := s.Push(1, 0, grad(1, nan)); err == nil {
		t.Fatal("NaN gradient accepted")
	}
	if nf, ref := s.NonFinite(), s.Refused(); !slices.Equal(nf, []int64{0, 1}) || !slices.Equal(ref, []int64{0, 0}) {
		t.Errorf("non-finite %v, refused %v; want [0 1] and [0 0]", nf, ref)
	}
	if o := s.Outlier(); o != nil {
		t.Errorf("a non-finite gradient made outlier %+v", o)
	}
}

// Honest runs are untouched: a gradient within K is applied exactly as
// without the guard, bit for bit.
func TestGuardLeavesHonestRunsExact(t *testing.T) {
	a := syncShard(t, 2, 2, 3, 20, config.Mean)
	b := syncShard(t, 2, 2, 3, 0, config.Mean)
	for i := range 3 * GuardWindow {
		x := float32(i%7) + 0.25
		for w := range 2 {
			g := grad(x, -x/3, float32(w)+1)
			ra, _ := a.Push(w, a.Version(), slices.Clone(g))
			rb, _ := b.Push(w, b.Version(), g)
			if ra.Outcome != Applied || rb.Outcome != Applied {
				t.Fatalf("step %d: %+v %+v", i, ra, rb)
			}
		}
	}
	if !slices.Equal(a.Params(), b.Params()) {
		t.Errorf("with the guard %v, without %v", a.Params(), b.Params())
	}
}

// --aggregate trimmed-mean: a step applies the per-coordinate trimmed
// mean of its gradients; a worker pushing huge values every step moves
// the parameters no more than the honest ones do.
func TestSyncTrimmedMean(t *testing.T) {
	s := syncShard(t, 4, 4, 2, 0, config.TrimmedMean)
	gs := [][]float32{{1, 40}, {2, 10}, {3, 20}, {-1e30, 1e30}}
	for w, g := range gs {
		r, err := s.Push(w, 0, g)
		if err != nil || r.Advanced != (w == 3) {
			t.Fatalf("worker %d: %+v, %v", w, r, err)
		}
	}
	// Coordinate 0 drops -1e30 and 3: mean(1,2); coordinate 1 drops 1e30
	// and 10: mean(40,20).
	if p := s.Params(); p[0] != -1.5 || p[1] != -30 {
		t.Errorf("params %v, want [-1.5 -30]", p)
	}
	// With a worker dead, three gradients: the median.
	s.SetLive([]int{0, 1, 3})
	for _, w := range []int{0, 1, 3} {
		s.Push(w, 1, gs[w])
	}
	if p := s.Params(); s.Version() != 2 || p[0] != -2.5 || p[1] != -70 {
		t.Errorf("version %d params %v, want 2 and [-2.5 -70] (medians 1 and 40)", s.Version(), p)
	}
	if _, err := NewShard(ShardConfig{Mode: config.Async, Workers: 2, Aggregate: config.TrimmedMean}, make([]float32, 1), s.opt, 0); err == nil {
		t.Error("an async shard accepted the trimmed mean")
	}
}

// The mean path stays allocation-free with the guard on; so does the
// trimmed mean.
func TestPushAllocatesNothing(t *testing.T) {
	for _, agg := range []config.Aggregate{config.Mean, config.TrimmedMean} {
		s := syncShard(t, 3, 3, 1000, 20, agg)
		g := make([]float32, 1000)
		for i := range g {
			g[i] = float32(i%13) - 6
		}
		warm(t, s, 3, g)
		allocs := testing.AllocsPerRun(50, func() {
			v := s.Version()
			for w := range 3 {
				s.Push(w, v, g)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per step", agg, allocs)
		}
	}
}

// The guard's norm replaces the finite check's pass over the gradient:
// BenchmarkSumSquares against the loop it replaced (finiteOnly).
func BenchmarkSumSquares(b *testing.B) {
	g := benchGrad()
	b.SetBytes(int64(4 * len(g)))
	for range b.N {
		if !isFinite(sumSquares(g)) {
			b.Fatal("not finite")
		}
	}
}

func BenchmarkFiniteOnly(b *testing.B) {
	g := benchGrad()
	b.SetBytes(int64(4 * len(g)))
	for range b.N {
		if !finiteOnly(g) {
			b.Fatal("not finite")
		}
	}
}

// finiteOnly is the check PushAt made before the norm guard.
func finiteOnly(x []float32) bool {
	for _, v := range x {
		if v-v != 0 {
			return false
		}
	}
	return true
}

func benchGrad() []float32 {
	g := make([]float32, 318_000) // a default run's shard
	for i := range g {
		g[i] = float32(i%17) * 1e-3
	}
	return g
}

func BenchmarkPushSync(b *testing.B) {
	for _, agg := range []config.Aggregate{config.Mean, config.TrimmedMean} {
		b.Run(string(agg), func(b *testing.B) {
			g := benchGrad()
			opt, err := optim.New(optim.Config{Name: "momentum", LR: 0.1, Momentum: 0.9}, len(g))
			if err != nil {
				b.Fatal(err)
			}
			s, err := NewShard(ShardConfig{Mode: config.Sync, Replicas: 4, Workers: 4, NormGuard: 20, Aggregate: agg}, make([]float32, len(g)), opt, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(4 * 4 * len(g)))
			for range b.N {
				v := s.Version()
				for w := range 4 {
					s.Push(w, v, g)
				}
			}
		})
	}
}

// Over the server: a refused push is answered as dropped (STALE, which
// the data plane carries), counted by worker and reason, and reported in
// Status with the first outlier.
func TestServerRefusesAndReports(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	g := make([]float32, n)
	for i := range g {
		g[i] = 0.5
	}
	push := func(w int32, g []float32) *pb.PushResponse {
		t.Helper()
		st, _ := srv.Status(ctx, &pb.StatusRequest{})
		resp, err := srv.Push(ctx, &pb.PushRequest{RunId: "r", Worker: w, Version: st.Version, Grad: wire.Bytes(g), Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for range GuardWindow {
		push(0, g)
		push(1, g)
	}
	huge := slices.Clone(g)
	huge[0] = 1e9
	if resp := push(1, huge); resp.Outcome != pb.PushResponse_STALE {
		t.Errorf("refused push answered %v, want STALE", resp.Outcome)
	}
	if got := testutil.ToFloat64(srv.m.RefusedGradients.WithLabelValues("1", "norm")); got != 1 {
		t.Errorf(`pstrain_ps_refused_gradients_total{worker="1",reason="norm"} = %v, want 1`, got)
	}
	st, _ := srv.Status(ctx, &pb.StatusRequest{})
	if !slices.Equal(st.RefusedGradients, []int64{0, 1}) || st.FirstOutlierWorker == nil || *st.FirstOutlierWorker != 1 {
		t.Errorf("status refused %v, first outlier %v; want [0 1] and worker 1", st.RefusedGradients, st.FirstOutlierWorker)
	}
	if got := testutil.CollectAndCount(srv.m.GradientNormRatio); got != 1 {
		t.Errorf("norm ratio histogram: %d series", got)
	}
}

// The chief's learning-rate factor scales the rate and its schedule.
func TestInitLRFactor(t *testing.T) {
	srv, _, n := newTestServer(t, 1, func(r *config.Run) { r.Workers, r.PS, r.Optimizer, r.LR = 1, 1, "sgd", 1 })
	o := OptionsFor(func() config.Run {
		r := config.Default()
		r.Workers, r.PS, r.Optimizer, r.LR, r.LRSchedule = 1, 1, "sgd", 1, "constant"
		return r
	}())
	o.LRFactor = 0.25
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	ctx := context.Background()
	if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: o.Proto(),
		Params: wire.Bytes(make([]float32, n)), Generation: 2, ModelSpec: convert.ModelSpec(spec)}); err != nil {
		t.Fatal(err)
	}
	g := make([]float32, n)
	g[0] = 1
	if _, err := srv.Push(ctx, &pb.PushRequest{RunId: "r", Grad: wire.Bytes(g), Generation: 2}); err != nil {
		t.Fatal(err)
	}
	_, params, _, _, _ := srv.Snapshot()
	if params[0] != -0.25 {
		t.Errorf("param %v after a gradient of 1 at lr 1 x factor 0.25, want -0.25", params[0])
	}
	o.LRFactor = 2
	if _, err := OptionsFromProto(o.Proto()); err == nil {
		t.Error("lr_factor 2 accepted")
	}
}

// The chief's learning-rate factor scales the embedding rows' rate too.
func TestInitLRFactorScalesRows(t *testing.T) {
	for _, factor := range []float64{0, 0.25} { // 0: no rollback yet, the rate as declared
		srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
		r := config.Default()
		r.Mode, r.Workers, r.PS, r.LRSchedule = config.Async, 1, 1, "constant"
		o := OptionsFor(r)
		o.LRFactor = factor
		spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
		n := spec.NumParams()
		table := embed.TableConfig{Name: "emb/C1", Dim: 2, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}
		ctx := context.Background()
		if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: o.Proto(), Generation: 1,
			Params: wire.Bytes(make([]float32, n)), ModelSpec: convert.ModelSpec(spec), Tables: TableSpecs([]embed.TableConfig{table})}); err != nil {
			t.Fatal(err)
		}
		row := func() []float32 {
			resp, err := srv.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{5}}}})
			if err != nil {
				t.Fatal(err)
			}
			v, err := wire.Floats(resp.Tables[0].Values)
			if err != nil {
				t.Fatal(err)
			}
			return slices.Clone(v)
		}
		before := row()
		if _, err := srv.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Tables: []*pb.RowBlock{
			{Table: "emb/C1", Keys: []uint64{5}, Values: wire.Bytes([]float32{1, 1})}}}); err != nil {
			t.Fatal(err)
		}
		after, want := row(), float32(1)
		if factor > 0 {
			want = float32(factor)
		}
		for i := range after {
			if got := before[i] - after[i]; math.Abs(float64(got-want)) > 1e-6 {
				t.Errorf("factor %v: the row moved by %v after a gradient of 1 at rate 1, want %v", factor, got, want)
			}
		}
	}
}

// A shard the chief re-initialises (a rollback) keeps its norm guard's
// window: no warm-up for an attacker to time a gradient for. A new run
// starts afresh.
func TestReinitKeepsTheGuard(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	g := make([]float32, n)
	for i := range g {
		g[i] = 0.5
	}
	for range GuardWindow {
		for w := range 2 {
			st, _ := srv.Status(ctx, &pb.StatusRequest{})
			if _, err := srv.Push(ctx, &pb.PushRequest{RunId: "r", Worker: int32(w), Version: st.Version, Grad: wire.Bytes(g), Generation: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := config.Default()
	r.Workers, r.PS, r.Optimizer, r.LRSchedule = 2, 1, "momentum", "constant"
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	reinit := func(run string, version int64) {
		t.Helper()
		if _, err := srv.Init(ctx, &pb.InitRequest{RunId: run, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
			Params: wire.Bytes(make([]float32, n)), Generation: 2, ModelSpec: convert.ModelSpec(spec), Version: version}); err != nil {
			t.Fatal(err)
		}
	}
	// Restored at the version reached: every norm of the window belongs
	// to the restored model's past.
	reinit("r", GuardWindow)
	huge := slices.Clone(g)
	huge[0] = 1e9
	resp, err := srv.Push(ctx, &pb.PushRequest{RunId: "r", Worker: 1, Version: GuardWindow, Grad: wire.Bytes(huge), Generation: 2})
	if err != nil || resp.Outcome != pb.PushResponse_STALE {
		t.Fatalf("huge gradient right after a re-init: %v, %v; want it refused", resp, err)
	}
	reinit("another run", GuardWindow)
	resp, err = srv.Push(ctx, &pb.PushRequest{RunId: "another run", Worker: 1, Version: GuardWindow, Grad: wire.Bytes(huge), Generation: 2})
	if err != nil || resp.Outcome != pb.PushResponse_APPLIED {
		t.Fatalf("a new run's first gradient: %v, %v; want it applied (warm-up)", resp, err)
	}
}

// A gradient dropped by --nan-policy skip (Drop) is treated like a
// refused one in a sync step: arrived, left out of the mean; it never
// enters the norm guard's window (a run of dropped gradients must not
// drag the reference down to where honest ones look huge).
func TestDropLeavesGradientOutOfTheStep(t *testing.T) {
	s := syncShard(t, 2, 2, 1, 20, config.Mean)
	warm(t, s, 2, grad(1))
	ref, v, p := s.guard.Reference(), s.Version(), s.Params()[0]
	if s.Drop(0, v, 0) {
		t.Fatal("the first of two arrivals completed the step")
	}
	if s.Drop(0, v, 0) || s.Drop(1, v-1, 0) {
		t.Fatal("a duplicate or stale drop completed the step")
	}
	if r, _ := s.Push(1, v, grad(2)); !r.Advanced || s.Params()[0] != p-2 {
		t.Fatalf("%+v, param %v: want the step applied with worker 1's gradient alone (%v)", r, s.Params()[0], p-2)
	}
	for range 2 * GuardWindow {
		s.Drop(0, s.Version(), 0)
		s.Drop(1, s.Version(), 0)
	}
	if s.guard.Reference() != ref {
		t.Errorf("dropped gradients moved the reference from %v to %v", ref, s.guard.Reference())
	}
}

// A guard inherited by a shard restored to an earlier version keeps only
// the norms of gradients of versions up to it: the norms of the model
// that went on (and was thrown away) never judge the restored model's
// gradients, and the reference restarts from the restored model's past.
func TestInheritKeepsOnlyTheRestoredPast(t *testing.T) {
	prev := NewNormGuard(20, 1e-9)
	for v := range int64(GuardWindow) {
		prev.AcceptAt(1, v) // an honest past
	}
	for v := int64(GuardWindow); v < 2*GuardWindow; v++ {
		prev.AcceptAt(1e6, v) // a model being ruined: its norms soar
	}
	if got := prev.Reference(); got != 1e6 {
		t.Fatalf("the ruined model's reference: %g, want 1e6", got)
	}
	g := NewNormGuard(20, 1e-9)
	g.Inherit(prev, 2*GuardWindow-1)
	if got := g.Reference(); got != 1e6 {
		t.Errorf("restored at the version reached: reference %g, want the whole window's 1e6", got)
	}
	g = NewNormGuard(20, 1e-9)
	g.Inherit(prev, GuardWindow/2)
	if got := g.Reference(); got != 0 {
		t.Errorf("rolled back to version %d: reference %g, want a warm-up (the ring only held later norms)", GuardWindow/2, got)
	}
	if v := g.Judge(5); v.Refuse {
		t.Errorf("an honest gradient right after the rollback refused: %+v", v)
	}
	// Rolled back into a window that still holds the honest past.
	prev = NewNormGuard(20, 1e-9)
	for v := range int64(GuardWindow + 8) {
		n := 1.0
		if v >= GuardWindow {
			n = 1e6
		}
		prev.AcceptAt(n, v)
	}
	g = NewNormGuard(20, 1e-9)
	g.Inherit(prev, GuardWindow-1)
	if got := g.Reference(); got != 0 || len(g.window) != GuardWindow-8 {
		t.Errorf("kept %d norms, reference %g; want the %d honest ones and a warm-up", len(g.window), got, GuardWindow-8)
	}
	for v := range int64(8) {
		g.AcceptAt(2, GuardWindow+v)
	}
	if got := g.Reference(); got != 1 && got != 1.5 {
		t.Errorf("reference after the window filled again: %g, want the restored past's (1)", got)
	}
}
