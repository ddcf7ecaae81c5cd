package worker

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/pstrain/pstrain/ps"
)

// Action is a decision of the Core for the driver (Worker.Run) to carry
// out. Actions are carried out in the order they are returned. Those
// that do I/O (PullRound, Push) start it and return at once; their
// outcomes come back through Core.Pulled and Core.Pushed, one per
// shard, in any order. Those that compute (HeadStart, Compute) run to
// the end before the next action and report through the Core method
// named in their comment; each is the last action of its batch.
type Action interface {
	fmt.Stringer
	action()
}

// PullRound pulls every shard in Pulls in parallel, each waiting at its
// shard until the shard reaches MinVersion (Bounded: at most the
// catch-up delay, after which it is answered as stalled) and telling the
// shard the Generation the worker last saw of it. A shard's parameters
// go into the net: read in place where the pull left them if the shard
// is read in place (CoreParams.InPlace), else into its weights. Every
// pull is answered by Core.Pulled.
type PullRound struct {
	Pulls []PullOrder
	// Next says these are the next step's pulls, sent with this step's
	// pushes (CoreParams.Overlap).
	Next bool
}

// PullOrder is one pull of a PullRound.
type PullOrder struct {
	ps.Pull
	Generation int64
}

// CancelPulls cancels the pulls of the round under way that have not
// been answered: a shard said training is done, or the step they
// belong to failed. Each is still answered by Core.Pulled (with the
// cancellation's error).
type CancelPulls struct{}

// TakeBack has the net read shard Shard's parameters from its weights
// again, after copying into them what it read in place where the
// shard's last pull left them (CopyIn; without it, the region may have
// been unmapped by a pull that failed).
type TakeBack struct {
	Shard  int
	CopyIn bool
}

// Forget drops what the net computed of the next forward pass ahead
// (nn.Net.Forget).
type Forget struct{}

// Seek moves the batch source to data position Position.
type Seek struct{ Position int64 }

// HeadStart starts the step's forward pass before every shard answered:
// it loads the batch at the data position into the net's input first if
// Load, then computes the first product's row blocks starting at Rows,
// in order, until the net refuses one (nn.Net.ForwardRows). Answered by
// Core.HeadStarted with the number of blocks computed.
type HeadStart struct {
	Load bool
	Rows []int
}

// Compute runs the forward and backward pass on the batch in the net's
// input, after loading the next batch of the source into it if Load.
// While it runs, the net may announce rows of the first layer's
// gradient as final (Core.RowsFinal). Answered by Core.Computed.
type Compute struct {
	Load bool
	// Views are the shards' views the passes compute from (a net that
	// reads rows of its own reads them at these versions: ViewStepper).
	Views []ps.PullView
}

// PushKind says which gradient a Push carries.
type PushKind int

const (
	// StepPush is the rest of a step's gradient, after its backward pass.
	StepPush PushKind = iota
	// EarlyPush is the slices of a step's gradient that are final while
	// the backward pass still runs (the shards of the first layer's
	// later rows and of the layers above).
	EarlyPush
	// CatchUpPush is a catch-up gradient, to the shards behind the others.
	CatchUpPush
)

func (k PushKind) String() string {
	return [...]string{"step", "early", "catch-up"}[k]
}

// Push pushes each shard in Shards its slice of the gradient the net
// holds, scaled by Scale (a gradient fault; 1: as computed), tagged with
// the version and generation Tags[shard] and the data position after
// the batch. Each shard's push is answered by Core.Pushed.
type Push struct {
	Kind         PushKind
	Step         int64 // the steps done before this one
	Shards       []int
	Tags         []ps.PullView // by shard
	DataPosition int64
	Loss         float32
	Scale        float32
}

// Phase is how long one phase of a step took (metrics.PhasePull,
// PhaseCompute, PhasePush), the step being the steps done before it.
type Phase struct {
	Name string
	Step int64
	Took time.Duration
}

// StepDone says every push of a step was answered: Steps steps are
// done, the last with loss Loss. HeadStarted says it began before every
// shard answered its pull; Refused lists the shards that refused its
// pushes (PushRefused).
type StepDone struct {
	Steps       int64
	Loss        float32
	HeadStarted bool
	Refused     []int
}

// Finish ends Run: training is done (Err nil), or Err. Nothing is under
// way when it comes, and the net reads every parameter from its weights.
type Finish struct{ Err error }

func (PullRound) action()   {}
func (CancelPulls) action() {}
func (TakeBack) action()    {}
func (Forget) action()      {}
func (Seek) action()        {}
func (HeadStart) action()   {}
func (Compute) action()     {}
func (Push) action()        {}
func (Phase) action()       {}
func (StepDone) action()    {}
func (Finish) action()      {}

func (a PullRound) String() string {
	var b strings.Builder
	b.WriteString("pull")
	if a.Next {
		b.WriteString(" (next step)")
	}
	for _, p := range a.Pulls {
		if p.MinVersion == math.MaxInt64 {
			fmt.Fprintf(&b, " ps/%d@max", p.Shard)
		} else {
			fmt.Fprintf(&b, " ps/%d@%d", p.Shard, p.MinVersion)
		}
		if p.Generation != 0 {
			fmt.Fprintf(&b, ":g%d", p.Generation)
		}
		if p.Bounded {
			b.WriteString("(bounded)")
		}
	}
	return b.String()
}

func (CancelPulls) String() string { return "cancel-pulls" }

func (a TakeBack) String() string {
	return fmt.Sprintf("take-back ps/%d copy-in=%t", a.Shard, a.CopyIn)
}

func (Forget) String() string    { return "forget" }
func (a Seek) String() string    { return fmt.Sprintf("seek %d", a.Position) }
func (a Compute) String() string { return fmt.Sprintf("compute load=%t", a.Load) }

func (a HeadStart) String() string {
	return fmt.Sprintf("head-start load=%t rows=%v", a.Load, a.Rows)
}

func (a Push) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "push %s", a.Kind)
	for _, s := range a.Shards {
		fmt.Fprintf(&b, " ps/%d@%d", s, a.Tags[s].Version)
		if g := a.Tags[s].Generation; g != 0 {
			fmt.Fprintf(&b, ":g%d", g)
		}
	}
	fmt.Fprintf(&b, " position=%d loss=%g", a.DataPosition, a.Loss)
	if a.Scale != 1 {
		fmt.Fprintf(&b, " scale=%g", a.Scale)
	}
	return b.String()
}

func (a Phase) String() string {
	return fmt.Sprintf("phase %s step=%d took=%v", a.Name, a.Step, a.Took)
}

func (a StepDone) String() string {
	s := fmt.Sprintf("step-done steps=%d loss=%g head-started=%t", a.Steps, a.Loss, a.HeadStarted)
	if len(a.Refused) > 0 {
		s += fmt.Sprintf(" refused=%v", a.Refused)
	}
	return s
}

func (a Finish) String() string {
	if a.Err == nil {
		return "finish done"
	}
	return "finish err=" + a.Err.Error()
}
