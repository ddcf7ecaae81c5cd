package worker

import (
	"fmt"
	"math"
	"sync"

	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/transport/compress"
)

// compressor is a worker's --compress state: per shard, the push
// codec's error-feedback residual and the buffer its pushes are encoded
// into (when pushes are compressed), and the parameters as its
// compressed pulls built them (when pulls are; the shard's
// compress.Mirror of this worker has the same). Each shard's are used by
// that shard's push or pull alone, and a shard has one push and one pull
// under way at a time; a pull's parameters are read (scattered into the
// net) before the shard's next pull is sent.
type compressor struct {
	fb  []*compress.Feedback // nil: pushes go uncompressed
	gen []int64              // the generation of the parameters fb's residual came from
	buf [][]byte
	rep []*compress.Replica // nil: pulls come uncompressed
}

// newCompressor is the compressor of setting for plan's shards (nil when
// neither direction is compressed).
func newCompressor(setting compress.Setting, plan partition.Plan) *compressor {
	if setting.Off() {
		return nil
	}
	c := &compressor{}
	for _, sh := range plan.Shards {
		if setting.Push.Kind != compress.None {
			fb := compress.NewFeedback(setting.Push.Codec(), sh.Size)
			c.fb = append(c.fb, fb)
			c.buf = append(c.buf, make([]byte, fb.EncodedLen()))
			c.gen = append(c.gen, 0)
		}
		if setting.Pull.Kind != compress.None {
			c.rep = append(c.rep, compress.NewReplica(setting.Pull.Codec(), sh.Size))
		}
	}
	return c
}

// pushes says whether c compresses the pushes (false for nil).
func (c *compressor) pushes() bool { return c != nil && c.fb != nil }

// pulls says whether c compresses the pulls (false for nil).
func (c *compressor) pulls() bool { return c != nil && c.rep != nil }

// encode adds shard s's gradient (its segments), computed from
// parameters of generation gen, to its residual and returns the payload
// to push; what is not sent stays in the residual for the shard's next
// push. A residual of another generation is dropped first: it came from
// parameters the chief replaced (a rollback, a restore), whose timeline
// the shard no longer follows. The payload is valid until the next
// encode.
func (c *compressor) encode(s int, gen int64, segs [][]float32) ([]byte, error) {
	if gen != 0 && gen != c.gen[s] {
		if c.gen[s] != 0 {
			c.fb[s].Reset()
		}
		c.gen[s] = gen
	}
	b, err := c.fb[s].Encode(c.buf[s], segs)
	if err == nil {
		c.buf[s] = b
	}
	return b, err
}

// applyPull applies shard s's compressed pull answer and returns the
// shard's parameters as the worker now holds them (valid until the
// shard's next pull). A malformed answer is an error, and the next pull
// asks for the parameters whole.
func (c *compressor) applyPull(s int, ans []byte) ([]float32, error) {
	if err := c.rep[s].Apply(ans); err != nil {
		return nil, err
	}
	return c.rep[s].Values(), nil
}

// wireCounts are the bytes a worker's pushes and pulls put on the wire
// (payloads) and the steps it finished, since it started: its heartbeats
// carry them to the chief, whose report divides them. The bytes of a
// step's calls count once the step is done (a pull sent ahead, beside a
// push, counts with the step before the one it serves), so that bytes
// and steps agree whenever they are read.
type wireCounts struct {
	mu                          sync.Mutex
	steps, pushBytes, pullBytes int64
	pendingPush, pendingPull    int64
}

func (c *wireCounts) pushed(n int) {
	c.mu.Lock()
	c.pendingPush += int64(n)
	c.mu.Unlock()
}

func (c *wireCounts) pulled(n int) {
	c.mu.Lock()
	c.pendingPull += int64(n)
	c.mu.Unlock()
}

func (c *wireCounts) stepDone() {
	c.mu.Lock()
	c.steps++
	c.pushBytes += c.pendingPush
	c.pullBytes += c.pendingPull
	c.pendingPush, c.pendingPull = 0, 0
	c.mu.Unlock()
}

// WireCounts returns the steps the worker finished and the payload bytes
// of their pushes and pulls, since it started.
func (w *Worker) WireCounts() (steps, pushBytes, pullBytes int64) {
	w.wire.mu.Lock()
	defer w.wire.mu.Unlock()
	return w.wire.steps, w.wire.pushBytes, w.wire.pullBytes
}

// logUnsent logs what the push residuals hold when training ends: what a
// crash of this worker would lose, as an L2 norm beside that of the last
// step's gradient (docs/wire.md, "What a crash loses").
func (w *Worker) logUnsent() {
	if !w.comp.pushes() {
		return
	}
	grads, err := w.cfg.Net.Grads()
	if err != nil {
		return
	}
	var res, last float64
	for s, fb := range w.comp.fb {
		res += sumSquares(fb.Residual())
		for _, seg := range w.cfg.Plan.Segments(s, grads) {
			last += sumSquares(seg)
		}
	}
	w.cfg.Log.Info("compression: gradient left in the residuals, never pushed", "worker", w.cfg.Index,
		"residual_norm", fmt.Sprintf("%.4g", math.Sqrt(res)), "last_gradient_norm", fmt.Sprintf("%.4g", math.Sqrt(last)))
}

func sumSquares(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return s
}
