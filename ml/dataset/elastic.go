package dataset

import (
	"errors"
	"fmt"
	"sync"
)

// DataPlan is how the training set is split among a changing number of
// workers (docs/elastic.md). It is a list of eras: from era k's first
// epoch on (until the next era's), workers 0..Workers-1 each read shard
// i of Workers, PerEpoch(k) full batches of it per epoch. Every member of
// an era reads the same number of batches per epoch, so in a sync run,
// where every member contributes one batch to every step, an era's epoch
// boundaries are global steps: Era.Step + m*PerEpoch(k).
//
// A worker's data position (how many of its batches the model holds,
// docs/recovery.md "Data positions") counts its batches across the eras
// it is a member of, in order: era k's batches of worker w are the
// positions from Start(w, k) (the batches of w's earlier eras) on. So a
// position means the same batch whenever it is read, a worker that is
// behind at an era change reads the rest of its old shard first, and a
// worker that leaves and later comes back goes on after its last era.
//
// The plan is the chief's (it decides the eras); every worker receives
// it at registration and in heartbeat answers (the wire's DataPlan
// message, package proto/convert).
type DataPlan struct {
	// N is the number of training samples (after --data-fraction) and
	// Batch the per-worker batch size.
	N     int   `json:"n"`
	Batch int   `json:"batch"`
	Eras  []Era `json:"eras"`
	// Hold > 0 (async and ssp runs with fixed shards, a change being
	// prepared): no member of the last era reads a batch of global epoch
	// Hold or later until it has a plan without the hold
	// (ElasticBatches.Next waits).
	Hold int64 `json:"hold,omitempty"`
	// Chunk > 0 makes the plan a queue (queue.go): Leases are, by
	// worker, the runs of chunks it was handed, in order, and NextChunk the
	// queue's next chunk (chunk c is chunk c%ChunksPerEpoch of epoch
	// c/ChunksPerEpoch).
	Chunk     int       `json:"chunk,omitempty"`
	Leases    [][]Lease `json:"leases,omitempty"`
	NextChunk int64     `json:"next_chunk,omitempty"`
}

// Era is one membership of the data: from global epoch Epoch (and, in a
// sync run, global step Step) on, Workers workers.
type Era struct {
	Epoch   int64 `json:"epoch"`
	Step    int64 `json:"step"`
	Workers int   `json:"workers"`
}

// NewDataPlan is the plan of a run that starts with workers workers.
func NewDataPlan(n, batch, workers int) DataPlan {
	return DataPlan{N: n, Batch: batch, Eras: []Era{{Workers: workers}}}
}

// Validate reports a plan no worker could follow.
func (p DataPlan) Validate() error {
	if p.N < 0 || p.Batch < 1 || len(p.Eras) == 0 {
		return fmt.Errorf("data plan: n %d, batch %d, %d eras", p.N, p.Batch, len(p.Eras))
	}
	for k, e := range p.Eras {
		if e.Workers < 1 {
			return fmt.Errorf("data plan: era %d has %d workers", k, e.Workers)
		}
		// (A queue's eras only count the workers: two may start in one epoch.)
		if k > 0 && (e.Epoch < p.Eras[k-1].Epoch || e.Epoch == p.Eras[k-1].Epoch && !p.Queued() || e.Step < p.Eras[k-1].Step) {
			return fmt.Errorf("data plan: era %d (epoch %d, step %d) does not follow era %d (epoch %d, step %d)",
				k, e.Epoch, e.Step, k-1, p.Eras[k-1].Epoch, p.Eras[k-1].Step)
		}
	}
	if err := p.validateQueue(); err != nil {
		return err
	}
	if last := p.Last(); p.Hold != 0 && p.Hold <= last.Epoch {
		return fmt.Errorf("data plan: hold at epoch %d, not after the last era's first epoch %d", p.Hold, last.Epoch)
	}
	return nil
}

// Last is the current era.
func (p DataPlan) Last() Era { return p.Eras[len(p.Eras)-1] }

// PerEpoch is the number of full batches each member of era k reads per
// epoch: those of the era's smallest shard, floor(floor(N/W)/B), at
// least 1 (a shard smaller than a batch has one, as in FullBatches).
func (p DataPlan) PerEpoch(k int) int64 {
	return max(1, int64(p.N/p.Eras[k].Workers/p.Batch))
}

// epochs is how many epochs era k lasts (-1: the last era, open).
func (p DataPlan) epochs(k int) int64 {
	if k == len(p.Eras)-1 {
		return -1
	}
	return p.Eras[k+1].Epoch - p.Eras[k].Epoch
}

// Start is worker w's data position at the start of era k: its batches
// of the earlier eras it was a member of.
func (p DataPlan) Start(w, k int) int64 {
	var pos int64
	for j := 0; j < k; j++ {
		if w < p.Eras[j].Workers {
			pos += p.epochs(j) * p.PerEpoch(j)
		}
	}
	return pos
}

// Locate is where worker w's batch at data position pos is: era k (the
// worker reads shard w of Eras[k].Workers), global epoch epoch and the
// batch's index in that epoch. ok is false when w is a member of no era
// that holds pos (it was removed and its position is past its last era).
// In a queue (Queued) k is 0, the batch is of the epoch's permutation of
// the whole set, and ok is false past the worker's leased chunks.
func (p DataPlan) Locate(w int, pos int64) (k int, epoch, batch int64, ok bool) {
	if p.Queued() {
		epoch, batch, ok = p.locateQueued(w, pos)
		return 0, epoch, batch, ok
	}
	var start int64
	for k := range p.Eras {
		if w >= p.Eras[k].Workers {
			continue
		}
		f, n := p.PerEpoch(k), p.epochs(k)
		if n < 0 || pos < start+n*f {
			j := pos - start
			return k, p.Eras[k].Epoch + j/f, j % f, true
		}
		start += n * f
	}
	return 0, 0, 0, false
}

// StartOf is worker w's data position at the start of global epoch
// epoch of the last era: where it reads the era's epoch's first batch.
// ok is false when w is not a member of the last era or epoch is before
// the era's first.
func (p DataPlan) StartOf(w int, epoch int64) (int64, bool) {
	k := len(p.Eras) - 1
	if w >= p.Eras[k].Workers || epoch < p.Eras[k].Epoch {
		return 0, false
	}
	return p.Start(w, k) + (epoch-p.Eras[k].Epoch)*p.PerEpoch(k), true
}

// NextEpoch is the first global epoch of the last era that worker w,
// whose next batch is at position pos, has read nothing of: the
// earliest epoch a new era could start at for it. A worker that is not
// a member of the last era constrains nothing (the era's first epoch).
func (p DataPlan) NextEpoch(w int, pos int64) int64 {
	k := len(p.Eras) - 1
	e := p.Eras[k]
	start, ok := p.StartOf(w, e.Epoch)
	if !ok || pos <= start {
		return e.Epoch
	}
	f := p.PerEpoch(k)
	return e.Epoch + (pos-start+f-1)/f
}

// Ends is the data position after worker w's last batch when the last
// era does not have it (it was removed): it has read everything the
// plan gives it there (in a queue: its leased chunks). ok is false for a
// member of the last era.
func (p DataPlan) Ends(w int) (int64, bool) {
	k := len(p.Eras) - 1
	if w < p.Eras[k].Workers {
		return 0, false
	}
	if p.Queued() {
		return p.Leased(w), true
	}
	return p.Start(w, k), true
}

// Boundary is the first epoch boundary of the current era at or after
// step (a sync run: every member reads one batch per step), and the
// global epoch that starts there.
func (p DataPlan) Boundary(step int64) (at, epoch int64) {
	k := len(p.Eras) - 1
	e, f := p.Eras[k], p.PerEpoch(k)
	m := max(0, (step-e.Step+f-1)/f)
	return e.Step + m*f, e.Epoch + m
}

// Scale is the plan with an era of workers workers from global step at
// and epoch epoch on (Boundary's answer). Without a change it is p.
func (p DataPlan) Scale(at, epoch int64, workers int) DataPlan {
	q := p
	q.Hold = 0
	if workers == p.Last().Workers {
		return q
	}
	q.Eras = append(append([]Era(nil), p.Eras...), Era{Epoch: epoch, Step: at, Workers: workers})
	q.Hold = 0
	return q
}

// ShardLoader reads shard index of count of the training set (the
// worker task's TrainSet.Shard; tests' Dataset.Shard).
type ShardLoader func(index, count int) (Samples, error)

// ElasticBatches is a worker's stream of full batches under a DataPlan:
// the batch at data position p is batch b of global epoch e of the
// worker's shard in the era p falls in (DataPlan.Locate), in the order
// a Batcher over that shard with seed Seed+w gives (epoch e's
// permutation). Under a plan of one era it is FullBatches over shard w
// of W, but for the per-epoch count: every member reads PerEpoch full
// batches, those of the smallest shard.
//
// The plan is replaced with SetPlan (from the heartbeat goroutine): it
// loads the shard of any new era the worker is a member of before the
// new plan is used, so Next never reads a file. Next waits while the
// plan gives the worker no batch at its position: one at or past the
// plan's hold, or past its last era (a worker about to join, or one
// removed that has read all its batches), until a plan that does or
// Close. Next and SeekBatch are for the training loop; SetPlan, Plan,
// Close and the accessors may be called concurrently with them.
type ElasticBatches struct {
	worker int
	seed   int64
	load   ShardLoader

	mu       sync.Mutex
	changed  *sync.Cond // on mu: a new plan, or Close
	plan     DataPlan
	batchers map[[2]int]*Batcher // by (index, count) of a shard
	queue    *Batcher            // the whole set, for a queue plan
	refill   int64               // a queue: the position at which to ask for more chunks
	pos      int64
	waiting  bool // Next waits for a plan
	closed   bool
	nudges   chan struct{} // see Nudges
}

// NewElasticBatches returns worker's batches under plan, positioned at 0,
// with the shards of plan's eras it is a member of loaded.
func NewElasticBatches(worker int, seed int64, plan DataPlan, load ShardLoader) (*ElasticBatches, error) {
	b := &ElasticBatches{worker: worker, seed: seed, load: load, batchers: map[[2]int]*Batcher{}, nudges: make(chan struct{}, 1)}
	b.changed = sync.NewCond(&b.mu)
	if err := b.SetPlan(plan); err != nil {
		return nil, err
	}
	return b, nil
}

// ErrPastHold refuses a plan whose hold is at an epoch the worker has
// already read batches of: the plan in use stays.
var ErrPastHold = errors.New("data: the worker has read past the plan's hold")

// SetPlan replaces the plan after loading the shards its eras need. (The
// chief's plan only grows, but for a change a restarted chief dropped:
// the plan then loses the era that never took effect.) A plan with a
// hold at an epoch the worker has read batches of is refused
// (ErrPastHold).
func (b *ElasticBatches) SetPlan(p DataPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	queue, err := b.loadQueue(p)
	if err != nil {
		return err
	}
	loaded := map[[2]int]*Batcher{}
	for _, e := range p.Eras {
		key := [2]int{b.worker, e.Workers}
		if p.Queued() || b.worker >= e.Workers || loaded[key] != nil || b.has(key) {
			continue
		}
		ds, err := b.load(b.worker, e.Workers)
		if err != nil {
			return fmt.Errorf("data: shard %d of %d: %w", b.worker, e.Workers, err)
		}
		loaded[key] = NewBatcher(ds, p.Batch, b.seed+int64(b.worker))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range loaded {
		b.batchers[k] = v
	}
	if queue != nil {
		b.queue = queue
	}
	if p.Queued() {
		// Ask for more (a heartbeat at once) half way through the
		// batches unread, before they run out.
		b.refill = b.pos + max(1, (p.Leased(b.worker)-b.pos)/2)
	}
	if start, ok := p.StartOf(b.worker, p.Hold); p.Hold > 0 && ok && b.pos > start {
		return fmt.Errorf("%w: hold at epoch %d (position %d), worker %d at position %d", ErrPastHold, p.Hold, start, b.worker, b.pos)
	}
	b.plan = p
	b.changed.Broadcast()
	b.nudge()
	return nil
}

// Nudges receives when what a heartbeat says of the reading changed in
// a way the chief waits for: a new plan taken, Next waiting for one, or
// (a queue) half of the batches the worker held unread read.
func (b *ElasticBatches) Nudges() <-chan struct{} { return b.nudges }

// nudge signals Nudges without waiting.
func (b *ElasticBatches) nudge() {
	select {
	case b.nudges <- struct{}{}:
	default:
	}
}

// loadQueue reads the whole training set the first time a plan is a
// queue: every worker's Batcher over it has the run's seed, so epoch
// e's permutation is the same for all (nil: not needed).
func (b *ElasticBatches) loadQueue(p DataPlan) (*Batcher, error) {
	b.mu.Lock()
	have := b.queue != nil
	b.mu.Unlock()
	if !p.Queued() || have {
		return nil, nil
	}
	ds, err := b.load(0, 1)
	if err != nil {
		return nil, fmt.Errorf("data: the whole training set for the queue: %w", err)
	}
	return NewBatcher(ds, p.Batch, b.seed), nil
}

// Leases is the number of chunks the plan in use hands the worker (a
// queue; what a heartbeat says it knows).
func (b *ElasticBatches) Leases() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.plan.LeasedChunks(b.worker))
}

func (b *ElasticBatches) has(key [2]int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.batchers[key] != nil
}

// Plan is the plan in use.
func (b *ElasticBatches) Plan() DataPlan {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.plan
}

// Eras is the number of eras of the plan in use (what a heartbeat says
// the worker knows).
func (b *ElasticBatches) Eras() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.plan.Eras)
}

// Hold is the hold of the plan in use (0: none).
func (b *ElasticBatches) Hold() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.plan.Hold
}

// Waiting says Next is waiting for a plan that gives the worker a batch
// at its position.
func (b *ElasticBatches) Waiting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// Close ends the stream: a Next waiting returns, and every later one
// at once, without a batch (Ended says so).
func (b *ElasticBatches) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.changed.Broadcast()
}

// Ended says Close was called: Next reads no more batches.
func (b *ElasticBatches) Ended() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// ErrNoEra says a worker's position lies past its last era: it was
// removed from the run.
var ErrNoEra = errors.New("data: the worker is a member of no era at this position")

// Where locates the batch at position pos (DataPlan.Locate).
func (b *ElasticBatches) Where(pos int64) (era int, epoch, batch int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, e, i, ok := b.plan.Locate(b.worker, pos)
	if !ok {
		return 0, 0, 0, fmt.Errorf("%w (worker %d, position %d)", ErrNoEra, b.worker, pos)
	}
	return k, e, i, nil
}

// Next copies the batch at the current position into x and y and moves
// to the next position. It waits while the plan gives the worker no
// batch there (see ElasticBatches); after Close it returns at once and
// copies nothing.
func (b *ElasticBatches) Next(x []float32, y []uint8) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.closed {
		k, e, i, ok := b.plan.Locate(b.worker, b.pos)
		if ok && (b.plan.Hold == 0 || k < len(b.plan.Eras)-1 || e < b.plan.Hold) {
			b.pos++
			if b.plan.Queued() && b.pos == b.refill {
				b.nudge()
			}
			bt := b.queue
			if !b.plan.Queued() {
				bt = b.batchers[[2]int{b.worker, b.plan.Eras[k].Workers}]
			}
			bt.checkBuffers("ElasticBatches", x, y)
			bt.fullBatch(e*bt.perEpoch+i, x, y)
			return
		}
		if !b.waiting {
			b.waiting = true
			b.nudge()
		}
		b.changed.Wait()
		b.waiting = false
	}
}

// SeekBatch makes position the next batch. It panics if position < 0.
func (b *ElasticBatches) SeekBatch(position int64) {
	if position < 0 {
		panic(fmt.Sprintf("data: ElasticBatches.SeekBatch(%d): negative position", position))
	}
	b.mu.Lock()
	b.pos = position
	b.mu.Unlock()
}

// Position is the position of the batch Next returns next.
func (b *ElasticBatches) Position() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pos
}
