package worker

import (
	"context"

	"github.com/pstrain/pstrain/ps"
)

// Net is the passes a worker runs on its batches: nn.Net for an MLP or a
// CNN, CTRNet for a CTR model. Params and Grads are the dense model in
// model.Spec.Variables() order (what the shards hold, by the plan).
// A net that cannot compute ahead or read in place refuses
// SetEarlyRows, ForwardRows and ReadFrom (false), and the worker then
// does neither.
type Net interface {
	Batch() int
	Params() [][]float32
	Input() []float32
	SetLabels(labels []uint8)
	Step() (float32, error)
	Grads() ([][]float32, error)
	SetEarlyRows(rows []int, ready func(row int, loss float32)) bool
	ForwardRows(row int) bool
	Forget()
	ReadFrom(v, row int, data []float32) bool
}

// ViewStepper is a Net whose passes do I/O of their own (CTRNet: the
// embedding rows on the shards): the worker runs StepFrom instead of
// Step, with the views of the shards the pass computes from (their
// versions and generations). Its reads go under pull, which a stop of
// the worker cuts; its writes under push, which only the end of Run
// cuts, so that a step stopped after its first write still makes its
// others (the worker's dense push follows).
type ViewStepper interface {
	StepFrom(pull, push context.Context, views []ps.PullView) (float32, error)
}

// step runs net's passes: StepFrom for a ViewStepper, else Step.
func step(pull, push context.Context, net Net, views []ps.PullView) (float32, error) {
	if vs, ok := net.(ViewStepper); ok {
		return vs.StepFrom(pull, push, views)
	}
	return net.Step()
}
