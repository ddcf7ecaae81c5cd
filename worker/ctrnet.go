package worker

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/rowclient"
)

// RowStore is where a CTR worker reads and trains its rows
// (rowclient.Client): embed.Rows told the generation of the shards'
// state the worker computes from.
type RowStore interface {
	embed.Rows
	SetGeneration(g int64)
}

// CTRNet is a CTR model's passes (ctr.Net) as a worker's Net. Its input
// is a batch of samples encoded by EncodeCTR (what CTRSamples gives the
// worker's batch source), so a CTR worker follows its data shard, data
// positions and data plan as an MLP's does. StepFrom pulls the batch's
// rows at the version the dense weights were pulled at, computes, and
// pushes the rows' gradients before it returns: before the step's
// dense push, as a sync shard requires. With RideRows it leaves them
// to go with each shard's dense push instead (RowsRider).
type CTRNet struct {
	net    *ctr.Net
	rows   RowStore
	b      *ctrdata.Batch
	input  []float32
	ride   bool
	staged *rowclient.Staged // the last step's rows, with ride
}

var (
	_ ViewStepper = (*CTRNet)(nil)
	_ RowsRider   = (*CTRNet)(nil)
)

// RowsRider is a Net whose step may leave row gradients to go with
// each shard's dense push of the step (CTRNet with RideRows): the
// worker sends them ahead of it on the same connection (RowsPusher),
// which the shard answers in order, so it takes the rows first.
type RowsRider interface {
	// StagedRows is the last step's row pushes (nil: none).
	StagedRows() *rowclient.Staged
}

// RowsPusher is a DataPlane that can send row pushes ahead of a dense
// push on one connection (dataplane.Client; segs nil: in.Grad).
type RowsPusher interface {
	PushAfterRows(ctx context.Context, rows []*pb.PushRowsRequest, in *pb.PushRequest, segs [][]float32) ([]*pb.PushRowsResponse, *pb.PushResponse, error)
}

// rowStager is a RowStore that can make a push's requests without
// sending them (rowclient.Client).
type rowStager interface {
	StageTables(step int64, tables []embed.TableRows) (*rowclient.Staged, error)
}

// NewCTRNet wraps a training net; its rows go through rows.
func NewCTRNet(net *ctr.Net, rows RowStore) (*CTRNet, error) {
	if net.Grads() == nil {
		return nil, errors.New("worker: a CTR net without gradients cannot train")
	}
	s := net.Spec()
	schema := ctrdata.Schema{Dense: s.Input, Cat: s.Fields}
	return &CTRNet{net: net, rows: rows, b: ctrdata.NewBatch(schema, net.Batch()),
		input: make([]float32, net.Batch()*CTRWidth(schema))}, nil
}

// CTRWidth is the values a sample of schema s takes in a CTRNet's input:
// its dense values, then each key as two values (EncodeCTR).
func CTRWidth(s ctrdata.Schema) int { return s.Dense + 2*s.Cat }

// EncodeCTR writes sample i of b into x (CTRWidth values): the dense
// values, then each key's low and high 32 bits as the bit patterns of
// two float32 (copied, never computed on, so they come back intact).
func EncodeCTR(b *ctrdata.Batch, i int, x []float32) {
	s := b.Schema
	copy(x[:s.Dense], b.Dense[i*s.Dense:(i+1)*s.Dense])
	for f := range s.Cat {
		k := b.Key(i, f)
		x[s.Dense+2*f] = math.Float32frombits(uint32(k))
		x[s.Dense+2*f+1] = math.Float32frombits(uint32(k >> 32))
	}
}

// decode reads the input's n samples back into the batch.
func (n *CTRNet) decode() {
	s := n.b.Schema
	w := CTRWidth(s)
	n.b.N = n.net.Batch()
	for i := range n.b.N {
		x := n.input[i*w : (i+1)*w]
		copy(n.b.Dense[i*s.Dense:(i+1)*s.Dense], x[:s.Dense])
		for f := range s.Cat {
			lo, hi := math.Float32bits(x[s.Dense+2*f]), math.Float32bits(x[s.Dense+2*f+1])
			n.b.Keys[i*s.Cat+f] = uint64(hi)<<32 | uint64(lo)
		}
	}
}

// UseRows makes rows the net's row store from its next step on: a change
// of the PS count moves the rows to another count of shards. Call it
// between steps only. A net that rides its rows (RideRows) needs a
// store that can hold its pushes back.
func (n *CTRNet) UseRows(rows RowStore) error {
	if _, ok := rows.(rowStager); n.ride && !ok {
		return fmt.Errorf("worker: the CTR net's new row store (%T) cannot hold its pushes back", rows)
	}
	n.rows, n.staged = rows, nil
	return nil
}

// RideRows has each step leave its rows' gradients to go with the
// shards' dense pushes (RowsRider) instead of pushing them itself: every
// shard's dense client must then be a RowsPusher, and the row store a
// rowclient.Client. Call it before the first step.
func (n *CTRNet) RideRows() error {
	if _, ok := n.rows.(rowStager); !ok {
		return fmt.Errorf("worker: the CTR net's row store (%T) cannot hold its pushes back", n.rows)
	}
	n.ride = true
	return nil
}

// StagedRows implements RowsRider.
func (n *CTRNet) StagedRows() *rowclient.Staged { return n.staged }

// Batch implements Net.
func (n *CTRNet) Batch() int { return n.net.Batch() }

// Params implements Net: the dense layers.
func (n *CTRNet) Params() [][]float32 { return n.net.Params() }

// Input implements Net: the batch, encoded (EncodeCTR).
func (n *CTRNet) Input() []float32 { return n.input }

// SetLabels implements Net.
func (n *CTRNet) SetLabels(labels []uint8) { copy(n.b.Labels, labels) }

// Step implements Net; a CTRNet steps with StepFrom only.
func (n *CTRNet) Step() (float32, error) {
	return 0, errors.New("worker: a CTR net steps from the shards' views (StepFrom)")
}

// StepFrom implements ViewStepper: the rows are read (under pull) at
// the lowest version of views (a shard behind the others, being caught
// up, answers at once; the others hold that version or a later one) and
// their gradients pushed (under push) tagged with it, in the newest
// generation of views.
func (n *CTRNet) StepFrom(pull, push context.Context, views []ps.PullView) (float32, error) {
	if len(views) == 0 {
		return 0, errors.New("worker: a CTR step without the shards' views")
	}
	version, gen := views[0].Version, views[0].Generation
	for _, v := range views[1:] {
		version, gen = min(version, v.Version), max(gen, v.Generation)
	}
	n.rows.SetGeneration(gen)
	n.decode()
	loss, err := n.step(pull, push, version)
	if errors.Is(err, rowclient.ErrDone) {
		// Training ended under the step: its dense push is answered so
		// and the worker finishes.
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("worker: CTR step at version %d: %w", version, err)
	}
	return loss, nil
}

// step is ctr.Net.Step with its pull under pull and its push under
// push.
func (n *CTRNet) step(pull, push context.Context, version int64) (float32, error) {
	n.staged = nil
	if err := n.net.Load(n.b); err != nil {
		return 0, err
	}
	if err := n.net.Pull(pull, n.rows, version); err != nil {
		return 0, err
	}
	loss, err := n.net.Compute()
	if err != nil {
		return loss, err
	}
	if n.ride {
		n.staged, err = n.rows.(rowStager).StageTables(version, n.net.RowGradients())
		return loss, err
	}
	return loss, n.net.Push(push, n.rows, version)
}

// Grads implements Net: the dense layers' gradients.
func (n *CTRNet) Grads() ([][]float32, error) { return n.net.Grads(), nil }

// SetEarlyRows implements Net: a CTRNet pushes nothing early.
func (n *CTRNet) SetEarlyRows([]int, func(int, float32)) bool { return false }

// ForwardRows implements Net: a CTRNet computes nothing ahead.
func (n *CTRNet) ForwardRows(int) bool { return false }

// Forget implements Net: nothing is computed ahead.
func (n *CTRNet) Forget() {}

// ReadFrom implements Net: a CTRNet reads its weights only.
func (n *CTRNet) ReadFrom(int, int, []float32) bool { return false }
