package chief

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/ml/binmetric"
	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/rowclient"
)

// ctrEvalTimeout bounds the row reads of one CTR evaluation.
const ctrEvalTimeout = time.Minute

// ctrEval is an Evaluator of a CTR model: its dense weights in the net's
// Params, its rows read through rows (the shards', without creating
// any) or, for the initial model, initial (tables of no row: every key
// reads its seeded initial row, as on the shards).
type ctrEval struct {
	net           *ctr.Net
	test          ctrdata.Source
	rows, initial embed.Rows
	last          binmetric.Scores
}

// NewCTREvaluator builds the evaluator of a CTR model on test, in
// batches of up to batch samples; tables are the run's tables (their
// seeded initial rows score the initial model). Its rows come from the
// shards once UseRows gave their client. A CTR evaluation always scores
// the whole test set (AUC is not a mean over samples).
func NewCTREvaluator(spec model.Spec, test ctrdata.Source, batch int, tables []embed.TableConfig) (*Evaluator, error) {
	if test.Len() == 0 {
		return nil, fmt.Errorf("eval: empty test set")
	}
	net, err := ctr.New(spec, min(batch, test.Len()), false)
	if err != nil {
		return nil, err
	}
	local, err := embed.NewLocal(tables)
	if err != nil {
		return nil, err
	}
	return &Evaluator{ctr: &ctrEval{net: net, test: test, initial: ctr.PeekRows{P: local}}}, nil
}

// UseRows makes rows (the chief's rowclient: its pulls create no rows)
// where a CTR evaluator reads the model's rows.
func (e *Evaluator) UseRows(rows embed.Rows) {
	if e.ctr != nil {
		e.ctr.rows = rows
	}
}

// Binary is a CTR evaluator's last scores (AUC, log loss, normalized
// entropy); nil for another model's.
func (e *Evaluator) Binary() *binmetric.Scores {
	if e.ctr == nil {
		return nil
	}
	s := e.ctr.last
	return &s
}

// score scores the whole test set with the rows of rows (initial: the
// initial ones): the accuracy of predicting a click at probability 0.5
// or more, the mean log loss, and the samples; the scores are kept
// (Binary).
func (c *ctrEval) score(initial bool) (acc, loss float64, n int, err error) {
	rows := c.rows
	if initial || rows == nil {
		rows = c.initial
	}
	ctx, cancel := context.WithTimeout(context.Background(), ctrEvalTimeout)
	defer cancel()
	probs, labels, err := ctr.Predict(ctx, c.net, rows, c.test)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("eval: %w", err)
	}
	s, err := binmetric.Score(probs, labels)
	if err != nil {
		return 0, 0, 0, err
	}
	c.last = s
	correct := 0
	for i, p := range probs {
		if (p >= 0.5) == (labels[i] == 1) {
			correct++
		}
	}
	return float64(correct) / float64(len(probs)), s.LogLoss, len(probs), nil
}

// useRows gives a CTR evaluator the chief's client of the shards' rows:
// worker -1, whose pulls create no rows and count for no admission. With
// hot standbys each shard's reads go to its primary of the moment.
func (c *Chief) useRows() error {
	cfg := c.cfg
	if cfg.Evaluator == nil || cfg.Evaluator.ctr == nil {
		return nil
	}
	shards := make([]rowclient.Shard, len(cfg.PS))
	for s, p := range cfg.PS {
		shards[s] = p.Client
		if len(cfg.Standbys) > 0 {
			shards[s] = primaryRows{c: c, shard: s}
		}
	}
	rows, err := rowclient.New(rowclient.Config{Shards: shards, RunID: cfg.RunID, Worker: -1})
	if err != nil {
		return err
	}
	cfg.Evaluator.UseRows(rows)
	return nil
}

// primaryRows reads a shard's rows from whichever of its processes is
// its primary when a request is made.
type primaryRows struct {
	c     *Chief
	shard int
}

func (p primaryRows) PullRows(ctx context.Context, in *pb.PullRowsRequest, opts ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	return p.c.primary(p.shard).Client.PullRows(ctx, in, opts...)
}

// PullRowsPlaced is the primary's placed pull (rowclient.Placer) if its
// client has one, else PullRows then place.
func (p primaryRows) PullRowsPlaced(ctx context.Context, in *pb.PullRowsRequest, place func(*pb.PullRowsResponse) error) error {
	return rowclient.PullPlaced(ctx, p.c.primary(p.shard).Client, in, place)
}

func (p primaryRows) PushRows(ctx context.Context, in *pb.PushRowsRequest, opts ...grpc.CallOption) (*pb.PushRowsResponse, error) {
	return p.c.primary(p.shard).Client.PushRows(ctx, in, opts...)
}

// target is the accuracy the stop rule aims at (0: none, the run trains
// its --epochs). A CTR model has none: its accuracy at 0.5 says little
// of a click model, and --target-accuracy does not apply to AUC.
func (p CoreParams) target() float64 {
	if p.Spec.IsCTR() {
		return 0
	}
	return p.Run.TargetAccuracy
}
