package ps

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/compress"
	"github.com/pstrain/pstrain/transport/wire"
)

// decompress decodes a compressed push (--compress) into a buffer the
// next push reuses, as gradient does for bfloat16. A payload of the
// wrong length or one its codec never writes is refused as a bad length,
// before the shard sees it. Call with mu held.
func (s *Server) decompress(b []byte) ([]float32, error) {
	c := s.opts.Compress.Push.Codec()
	n := len(s.shard.Params())
	if want := c.EncodedLen(n); len(b) != want {
		return nil, fmt.Errorf("%w: got %d bytes of %s, want %d", ErrBadLength, len(b), s.opts.Compress.Push, want)
	}
	if cap(s.wide) < n {
		s.wide = make([]float32, n)
	}
	g := s.wide[:n]
	if err := c.Decode(g, b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadLength, err)
	}
	return g, nil
}

// pullMirrors are the shard's copies of the parameters as each worker
// under --compress holds them (compress.Mirror): a worker's pull that
// asks for a delta is answered with the compressed difference between
// the parameters and its copy, which nothing but the answers changes.
// They live in the process: a restarted PS, or a standby taking over,
// has none, and answers each worker whole once.
type pullMirrors struct {
	mu   sync.Mutex // guards byWorker, not the mirrors
	byWk map[int32]*pullMirror
}

// pullMirror is one worker's mirror; mu serialises that worker's
// answers (one pull at a time per worker and shard, but a pull cut short
// may still be answering when the next arrives).
type pullMirror struct {
	mu     sync.Mutex
	spec   compress.Spec
	mirror *compress.Mirror
}

// answer turns resp, the full answer to req, into a compressed one when
// req asks for a delta and the run compresses its pulls (spec, their
// codec); otherwise it
// returns resp as it is. resp.Params, the current snapshot, is read
// only. Call without the server's mu: encoding takes a pass or more over
// the shard, which pushes should not wait for.
func (ms *pullMirrors) answer(req *pb.PullRequest, resp *pb.PullResponse, spec compress.Spec) (*pb.PullResponse, error) {
	if !req.Delta || req.Worker < 0 || spec.Kind == compress.None || resp.Params == nil {
		return resp, nil
	}
	params, err := wire.Floats(resp.Params)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	pm := ms.mirrorOf(req.Worker, spec, len(params))
	pm.mu.Lock()
	defer pm.mu.Unlock()
	ans, err := pm.mirror.Answer(make([]byte, 0, 17+pm.spec.Codec().EncodedLen(len(params))), params, req.DeltaBase)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	resp.Params = ans
	return resp, nil
}

// mirrorOf is worker's mirror for n values under spec, a new one if it
// has none that fits (a new run's options, a shard of another size).
func (ms *pullMirrors) mirrorOf(worker int32, spec compress.Spec, n int) *pullMirror {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.byWk == nil {
		ms.byWk = map[int32]*pullMirror{}
	}
	pm := ms.byWk[worker]
	if pm == nil || pm.spec != spec || pm.mirror.Len() != n {
		// A number no earlier process of this shard likely used for this
		// worker: a worker holding an answer of one is answered whole.
		pm = &pullMirror{spec: spec, mirror: compress.NewMirror(spec.Codec(), n, 1+rand.Int64N(1<<62))}
		ms.byWk[worker] = pm
	}
	return pm
}
