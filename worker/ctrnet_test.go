package worker

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/rowclient"
	"github.com/pstrain/pstrain/transport/wire"
)

// recordingRows is embed.Local that records the versions and
// generation its calls came with.
type recordingRows struct {
	*embed.Local
	gen           int64
	pulls, pushes []int64
}

func (r *recordingRows) SetGeneration(g int64) { r.gen = g }

func (r *recordingRows) Pull(ctx context.Context, step int64, table string, keys []uint64, out []float32) error {
	r.pulls = append(r.pulls, step)
	return r.Local.Pull(ctx, step, table, keys, out)
}

func (r *recordingRows) Push(ctx context.Context, step int64, table string, keys []uint64, grads []float32) error {
	r.pushes = append(r.pushes, step)
	return r.Local.Push(ctx, step, table, keys, grads)
}

// smallCTR is the schema of 3 dense values and 2 keys a sample, and the
// CTR model of rows of dimension 4 and one hidden layer of 8 over it.
func smallCTR() (ctrdata.Schema, model.Spec) {
	r := config.Default()
	r.Model, r.EmbeddingDim, r.Hidden = "ctr", 4, []int{8}
	s := ctrdata.Schema{Dense: 3, Cat: 2}
	return s, r.CTRSpec(s.Dense, s.Cat)
}

// ctrBatch is a batch of n samples whose keys use all 64 bits, some of
// them NaN bit patterns as float32 halves.
func ctrBatch(s ctrdata.Schema, n int) *ctrdata.Batch {
	b := ctrdata.NewBatch(s, n)
	b.N = n
	for i := range n {
		b.Labels[i] = uint8(i % 2)
		for d := range s.Dense {
			b.Dense[i*s.Dense+d] = float32(i+d) / 10
		}
		for f := range s.Cat {
			b.Keys[i*s.Cat+f] = uint64(i%3)<<60 | 0x7fc00001 | uint64(f)<<33
		}
	}
	return b
}

// A CTR worker's samples go through the batch source as float32 rows
// and come back intact (keys of 64 bits, NaN patterns too), and its
// step trains exactly as ctr.Net does on the batch itself: the same
// loss and dense gradients, its rows read and pushed at the lowest
// version of the views, in their newest generation.
func TestCTRNetStepsAsTheNetOnTheBatch(t *testing.T) {
	s, spec := smallCTR()
	const n = 6
	b := ctrBatch(s, n)
	tables := func() *embed.Local {
		var cfgs []embed.TableConfig
		for _, tb := range spec.Tables() {
			cfgs = append(cfgs, embed.TableConfig{Name: tb.Name, Dim: tb.Dim, Seed: 5, Rule: embed.DefaultAdagrad(0.5)})
		}
		l, err := embed.NewLocal(cfgs)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	want, err := ctr.New(spec, n, true)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := ctr.New(spec, n, true)
	if err != nil {
		t.Fatal(err)
	}
	for v, p := range spec.Init(1) {
		copy(want.Params()[v], p)
		copy(inner.Params()[v], p)
	}
	rows := &recordingRows{Local: tables()}
	net, err := NewCTRNet(inner, rows)
	if err != nil {
		t.Fatal(err)
	}
	// Through the batch source, as the worker fills its input.
	batches := dataset.NewBatcher(NewCTRSamples(b), n, 1)
	y := make([]uint8, n)
	batches.Next(net.Input(), y)
	net.SetLabels(y)
	views := []ps.PullView{{Version: 7, Generation: 2}, {Version: 5, Generation: 3}}
	got, err := net.StepFrom(context.Background(), context.Background(), views)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rows.pulls, []int64{5, 5}) || !slices.Equal(rows.pushes, []int64{5, 5}) || rows.gen != 3 {
		t.Errorf("rows pulled at %v, pushed at %v, generation %d; want version 5 (the lowest) and generation 3", rows.pulls, rows.pushes, rows.gen)
	}
	// The batcher shuffles: the reference steps on the samples in the
	// order the net decoded them.
	ref := ctrdata.NewBatch(s, n)
	ref.N = n
	for i := range n {
		copy(ref.Dense[i*s.Dense:(i+1)*s.Dense], net.b.Dense[i*s.Dense:(i+1)*s.Dense])
		copy(ref.Keys[i*s.Cat:(i+1)*s.Cat], net.b.Keys[i*s.Cat:(i+1)*s.Cat])
		ref.Labels[i] = y[i]
	}
	if !sameSamples(b, ref) {
		t.Fatalf("the samples decoded are not the batch's:\n%v\n%v", ref.Keys, b.Keys)
	}
	loss, err := want.Step(context.Background(), tables(), 5, ref)
	if err != nil {
		t.Fatal(err)
	}
	grads, _ := net.Grads()
	if got != loss || !equalGrads(grads, want.Grads()) {
		t.Errorf("CTRNet step: loss %v, the net's on the batch %v (or the dense gradients differ)", got, loss)
	}
}

// sameSamples says a and b hold the same samples, in any order.
func sameSamples(a, b *ctrdata.Batch) bool {
	key := func(x *ctrdata.Batch, i int) string {
		s := x.Schema
		out := []byte{x.Labels[i]}
		for _, v := range x.Dense[i*s.Dense : (i+1)*s.Dense] {
			out = append(out, byte(math.Float32bits(v)), byte(math.Float32bits(v)>>8), byte(math.Float32bits(v)>>16), byte(math.Float32bits(v)>>24))
		}
		for _, k := range x.Keys[i*s.Cat : (i+1)*s.Cat] {
			for sh := 0; sh < 64; sh += 8 {
				out = append(out, byte(k>>sh))
			}
		}
		return string(out)
	}
	var ka, kb []string
	for i := range a.N {
		ka, kb = append(ka, key(a, i)), append(kb, key(b, i))
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return a.N == b.N && slices.Equal(ka, kb)
}

func equalGrads(a, b [][]float32) bool {
	return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
}

// doneRows answers every call as a shard whose training is over.
type doneRows struct{}

func (doneRows) SetGeneration(int64) {}
func (doneRows) Pull(context.Context, int64, string, []uint64, []float32) error {
	return fmt.Errorf("shard 0: %w", rowclient.ErrDone)
}
func (doneRows) Push(context.Context, int64, string, []uint64, []float32) error {
	return fmt.Errorf("shard 0: %w", rowclient.ErrDone)
}

// A step whose rows find training over is no failure (the dense push
// then says so and the worker finishes); another error fails the step.
func TestCTRNetStepWhenTrainingIsOver(t *testing.T) {
	_, spec := smallCTR()
	inner, err := ctr.New(spec, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	net, err := NewCTRNet(inner, doneRows{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.StepFrom(context.Background(), context.Background(), []ps.PullView{{Version: 3}}); err != nil {
		t.Errorf("a step after training ended: %v, want nil", err)
	}
	if _, err := net.StepFrom(context.Background(), context.Background(), nil); err == nil {
		t.Error("a step without views did not fail")
	}
}

// zeroShard is a rowclient.Shard whose rows are all zero; it counts
// the row pushes it is sent.
type zeroShard struct {
	dim    int
	pushes int
}

func (z *zeroShard) PullRows(_ context.Context, in *pb.PullRowsRequest, _ ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	out := &pb.PullRowsResponse{Version: in.MinVersion}
	for _, b := range in.Tables {
		n := len(b.Keys) + len(b.SmallKeys)
		out.Tables = append(out.Tables, &pb.RowBlock{Table: b.Table, Values: make([]byte, 4*z.dim*n)})
	}
	return out, nil
}

func (z *zeroShard) PushRows(context.Context, *pb.PushRowsRequest, ...grpc.CallOption) (*pb.PushRowsResponse, error) {
	z.pushes++
	return &pb.PushRowsResponse{}, nil
}

// A CTR net riding its rows pushes none itself: each shard's share of
// the step's row gradients (every unique key once, with its gradient)
// is staged for that shard's dense push, and the answers count as the
// row client's pushes. Without RideRows the net pushes them itself.
func TestCTRNetRidingRowsStagesThemForTheDensePushes(t *testing.T) {
	s, spec := smallCTR()
	const n = 6
	for _, ride := range []bool{false, true} {
		shards := []*zeroShard{{dim: 4}, {dim: 4}}
		rc, err := rowclient.New(rowclient.Config{Shards: []rowclient.Shard{shards[0], shards[1]}, RunID: "r"})
		if err != nil {
			t.Fatal(err)
		}
		inner, err := ctr.New(spec, n, true)
		if err != nil {
			t.Fatal(err)
		}
		net, err := NewCTRNet(inner, rc)
		if err != nil {
			t.Fatal(err)
		}
		if ride {
			if err := net.RideRows(); err != nil {
				t.Fatal(err)
			}
		}
		batches := dataset.NewBatcher(NewCTRSamples(ctrBatch(s, n)), n, 1)
		y := make([]uint8, n)
		batches.Next(net.Input(), y)
		net.SetLabels(y)
		if _, err := net.StepFrom(context.Background(), context.Background(), []ps.PullView{{Version: 3}}); err != nil {
			t.Fatal(err)
		}
		pushed := shards[0].pushes + shards[1].pushes
		st := net.StagedRows()
		if !ride {
			if pushed == 0 || st != nil {
				t.Fatalf("without riding: %d row pushes sent, staged %v", pushed, st)
			}
			continue
		}
		if pushed != 0 || st == nil {
			t.Fatalf("riding: %d row pushes sent, staged %v", pushed, st)
		}
		// Every unique key's gradient, once, in some shard's requests.
		want := map[string][]float32{}
		for _, tr := range inner.RowGradients() {
			for i, k := range tr.Keys {
				want[fmt.Sprint(tr.Table, k)] = tr.Rows[i*4 : (i+1)*4]
			}
		}
		got := 0
		for sh := range shards {
			reqs := st.Requests(sh)
			for _, req := range reqs {
				if req.Version != 3 || req.RunId != "r" {
					t.Fatalf("a staged push of version %d, run %q", req.Version, req.RunId)
				}
				for _, b := range req.Tables {
					vals, _ := wire.Floats(b.Values)
					for i, k := range append(b.Keys, b.SmallKeys...) {
						w, ok := want[fmt.Sprint(b.Table, k)]
						if !ok || !slices.Equal(vals[i*4:(i+1)*4], w) {
							t.Fatalf("shard %d was staged %s key %d: %v, want %v", sh, b.Table, k, vals[i*4:(i+1)*4], w)
						}
						got++
					}
				}
			}
			for i := range reqs {
				if err := st.Answered(sh, i, &pb.PushRowsResponse{Outcome: pb.PushResponse_STALE}); err != nil {
					t.Fatal(err)
				}
			}
		}
		stats := rc.Stats()
		if got != len(want) || stats.KeysPushed[0]+stats.KeysPushed[1] != int64(got) || stats.Stale != int64(len(st.Requests(0))+len(st.Requests(1))) {
			t.Fatalf("staged %d keys of %d; the client counted %v pushed, %d stale", got, len(want), stats.KeysPushed, stats.Stale)
		}
	}
}

// flakyRowsPusher is a RowsPusher whose first call takes only the
// first row push it is sent and then fails as Unavailable; later calls
// take everything. It records the keys of each call's rows.
type flakyRowsPusher struct {
	DataPlane
	calls [][]uint64
}

func (f *flakyRowsPusher) PushAfterRows(_ context.Context, rows []*pb.PushRowsRequest, in *pb.PushRequest, _ [][]float32) ([]*pb.PushRowsResponse, *pb.PushResponse, error) {
	var keys []uint64
	for _, r := range rows {
		keys = append(keys, r.Tables[0].SmallKeys...)
	}
	f.calls = append(f.calls, keys)
	answers := make([]*pb.PushRowsResponse, len(rows))
	if len(f.calls) == 1 {
		answers[0] = &pb.PushRowsResponse{}
		return answers, nil, status.Error(codes.Unavailable, "the dense push's shard went away")
	}
	for i := range answers {
		answers[i] = &pb.PushRowsResponse{}
	}
	return answers, &pb.PushResponse{Version: in.Version + 1}, nil
}

// A push sent again after a failure sends only the row pushes the shard
// has not taken (an async shard applies each it takes), and each taken
// row push counts once.
func TestPushAfterRowsSendsAgainOnlyTheRowsNotTaken(t *testing.T) {
	z := &zeroShard{dim: 1}
	rc, err := rowclient.New(rowclient.Config{Shards: []rowclient.Shard{z}, RunID: "r", MaxRequestBytes: 2 * (8 + 4)})
	if err != nil {
		t.Fatal(err)
	}
	// Five keys of one row value each, two a request: three requests.
	st, err := rc.StageTables(3, []embed.TableRows{{Table: "emb/C1", Keys: []uint64{1, 2, 3, 4, 5}, Rows: []float32{1, 2, 3, 4, 5}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.Requests(0)); n != 3 {
		t.Fatalf("%d requests staged, want 3", n)
	}
	f := &flakyRowsPusher{}
	w := &Worker{cfg: Config{Shards: []Shard{{Addr: "ps0", Client: f}}}}
	var resp *pb.PushResponse
	push, err := w.pushAfterRows(context.Background(), 0, st, &pb.PushRequest{Version: 3}, nil, &resp)
	if err != nil {
		t.Fatal(err)
	}
	if err := push(); status.Code(err) != codes.Unavailable || resp != nil {
		t.Fatalf("the first attempt: %v, %v", resp, err)
	}
	if err := push(); err != nil || resp == nil || resp.Version != 4 {
		t.Fatalf("the second attempt: %v, %v", resp, err)
	}
	if !slices.EqualFunc(f.calls, [][]uint64{{1, 2, 3, 4, 5}, {3, 4, 5}}, slices.Equal) {
		t.Fatalf("the attempts sent the keys %v, want all, then those of the requests not taken", f.calls)
	}
	if s := rc.Stats(); s.KeysPushed[0] != 5 || s.Requests[0] != 3 {
		t.Fatalf("counted %d keys pushed in %d requests, want 5 in 3", s.KeysPushed[0], s.Requests[0])
	}
}
