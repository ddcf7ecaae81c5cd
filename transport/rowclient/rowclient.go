// Package rowclient reads and trains embedding rows held by parameter
// servers: Client implements embed.Rows over N shards. A call's unique
// keys are split by embed.ShardOf, each shard's share is sent in
// requests of at most MaxRequestBytes of rows (one after the other), the
// shards are called in parallel, and the rows come back in the keys'
// order. The step is the version the rows are read at (a sync pull waits
// for the shard to reach it) and the version a push's gradients come
// from.
//
// In sync mode a worker pushes a step's rows before the step's dense
// gradient: the shard applies the rows its workers pushed when the dense
// step completes, and drops later ones as stale.
package rowclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pstrain/pstrain/ml/embed"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// DefaultMaxRequestBytes bounds a request's rows (or a response's): far
// below a PS's message limit (an Init of the dense model plus 1 MiB).
const DefaultMaxRequestBytes = 512 << 10

// ErrDone is returned when a shard says training is over (to a worker's
// client: the chief's reads the final model's rows).
var ErrDone = errors.New("rowclient: training is over")

// Config is what a Client needs.
type Config struct {
	// Shards are the parameter servers, by shard index.
	Shards []pb.ParameterServerClient
	RunID  string
	// Worker is the caller's worker index (-1: the chief, pulls only).
	Worker int32
	// MaxRequestBytes bounds the row payload of one request or response
	// (0: DefaultMaxRequestBytes).
	MaxRequestBytes int
	// Retry, if set, makes one request to one shard, call, and the
	// attempts again it judges worth it (a shard unavailable while it
	// restarts): a request is retried alone, never the call's requests
	// to the other shards, which an async shard would apply twice. Nil:
	// one attempt.
	Retry func(ctx context.Context, call func(context.Context) error) error
}

// Client is embed.Rows over the parameter servers; safe for concurrent
// use.
type Client struct {
	cfg Config
	gen atomic.Int64

	mu    sync.Mutex
	stats Stats
}

// Stats are what a Client sent and received, by shard.
type Stats struct {
	// KeysPulled and KeysPushed count the keys sent to each shard (each
	// one row served: the shard's load).
	KeysPulled, KeysPushed []int64
	// Requests counts the requests sent to each shard.
	Requests []int64
	// BytesSent and BytesReceived count the row payloads (keys and
	// values) sent and received.
	BytesSent, BytesReceived int64
	// Stale counts the pushes a shard dropped as stale.
	Stale int64
}

// RequestShares is each shard's share of the keys requested (pulled
// and pushed): the bench's embeddings.shard_request_share. All zero
// before any request.
func (s Stats) RequestShares() []float64 {
	out := make([]float64, len(s.Requests))
	var sum int64
	for i := range out {
		sum += s.KeysPulled[i] + s.KeysPushed[i]
	}
	if sum == 0 {
		return out
	}
	for i := range out {
		out[i] = float64(s.KeysPulled[i]+s.KeysPushed[i]) / float64(sum)
	}
	return out
}

var _ embed.Rows = (*Client)(nil)

// New returns a client of cfg.Shards.
func New(cfg Config) (*Client, error) {
	if len(cfg.Shards) == 0 {
		return nil, errors.New("rowclient: no shards")
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	n := len(cfg.Shards)
	return &Client{cfg: cfg, stats: Stats{KeysPulled: make([]int64, n), KeysPushed: make([]int64, n), Requests: make([]int64, n)}}, nil
}

// SetGeneration sets the generation the rows belong to (the worker's,
// from its dense pulls; 0: any).
func (c *Client) SetGeneration(g int64) { c.gen.Store(g) }

// Stats returns a copy of the client's counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.KeysPulled, s.KeysPushed, s.Requests = clone(s.KeysPulled), clone(s.KeysPushed), clone(s.Requests)
	return s
}

func clone(x []int64) []int64 { return append([]int64(nil), x...) }

// part is one request's keys: their indices in the call's keys.
type part struct {
	shard int
	idx   []int
}

// split cuts keys into requests: by shard, at most maxKeys each, in the
// keys' order within a shard.
func split(table string, keys []uint64, shards, maxKeys int) [][]part {
	by := make([][]int, shards)
	for i, k := range keys {
		s := embed.ShardOf(table, k, shards)
		by[s] = append(by[s], i)
	}
	out := make([][]part, shards)
	for s, idx := range by {
		for len(idx) > 0 {
			n := min(len(idx), maxKeys)
			out[s] = append(out[s], part{shard: s, idx: idx[:n]})
			idx = idx[n:]
		}
	}
	return out
}

// dimOf checks a call's shape and returns its rows' dimension (0: no
// keys).
func dimOf(keys []uint64, vals []float32) (int, error) {
	if len(keys) == 0 {
		if len(vals) != 0 {
			return 0, fmt.Errorf("rowclient: %d values for no keys", len(vals))
		}
		return 0, nil
	}
	if len(vals) == 0 || len(vals)%len(keys) != 0 {
		return 0, fmt.Errorf("rowclient: %d values for %d keys", len(vals), len(keys))
	}
	return len(vals) / len(keys), nil
}

// each runs do on every shard's parts in parallel (a shard's parts one
// after the other, each retried alone by Config.Retry) and returns the
// first error: the first failure cancels the calls still going to the
// other shards, whose errors are then only that.
func (c *Client) each(ctx context.Context, parts [][]part, do func(context.Context, part) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for s, ps := range parts {
		if len(ps) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range ps {
				if err := c.attempt(ctx, p, do); err != nil {
					once.Do(func() {
						first = fmt.Errorf("rowclient: shard %d: %w", s, err)
						cancel()
					})
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// attempt makes request p, through Config.Retry if set.
func (c *Client) attempt(ctx context.Context, p part, do func(context.Context, part) error) error {
	call := func(ctx context.Context) error { return do(ctx, p) }
	if c.cfg.Retry == nil {
		return call(ctx)
	}
	return c.cfg.Retry(ctx, call)
}

func (c *Client) maxKeys(dim int) int { return max(1, c.cfg.MaxRequestBytes/(dim*4+8)) }

// Pull implements embed.Rows: keys' rows into out, read at version step.
func (c *Client) Pull(ctx context.Context, step int64, table string, keys []uint64, out []float32) error {
	dim, err := dimOf(keys, out)
	if err != nil || dim == 0 {
		return err
	}
	parts := split(table, keys, len(c.cfg.Shards), c.maxKeys(dim))
	return c.each(ctx, parts, func(ctx context.Context, p part) error {
		ks := make([]uint64, len(p.idx))
		for j, i := range p.idx {
			ks[j] = keys[i]
		}
		blk, keyBytes := keyBlock(table, ks)
		req := &pb.PullRowsRequest{RunId: c.cfg.RunID, Worker: c.cfg.Worker, Generation: c.gen.Load(), MinVersion: step,
			Tables: []*pb.RowBlock{blk}}
		resp, err := c.cfg.Shards[p.shard].PullRows(ctx, req)
		if err != nil {
			return fmt.Errorf("pull of %d rows of %s: %w", len(ks), table, err)
		}
		if len(resp.Tables) != 1 || len(resp.Tables[0].Values) != len(ks)*dim*4 {
			return fmt.Errorf("pull of %d rows of %s of dimension %d: answered with %d blocks (want 1 of %d bytes)", len(ks), table, dim, len(resp.Tables), len(ks)*dim*4)
		}
		rows, err := wire.Floats(resp.Tables[0].Values)
		if err != nil {
			return err
		}
		for j, i := range p.idx {
			copy(out[i*dim:(i+1)*dim], rows[j*dim:(j+1)*dim])
		}
		c.count(p.shard, len(ks), 0, keyBytes, len(resp.Tables[0].Values), false)
		if resp.Done && c.cfg.Worker >= 0 { // the chief reads the final model's rows
			return ErrDone
		}
		return nil
	})
}

// Push implements embed.Rows: the gradients of keys' rows, computed from
// the rows at version step.
func (c *Client) Push(ctx context.Context, step int64, table string, keys []uint64, grads []float32) error {
	dim, err := dimOf(keys, grads)
	if err != nil || dim == 0 {
		return err
	}
	parts := split(table, keys, len(c.cfg.Shards), c.maxKeys(dim))
	return c.each(ctx, parts, func(ctx context.Context, p part) error {
		ks, gs := make([]uint64, len(p.idx)), make([]float32, 0, len(p.idx)*dim)
		for j, i := range p.idx {
			ks[j] = keys[i]
			gs = append(gs, grads[i*dim:(i+1)*dim]...)
		}
		blk, keyBytes := keyBlock(table, ks)
		blk.Values = wire.Bytes(gs)
		req := &pb.PushRowsRequest{RunId: c.cfg.RunID, Worker: c.cfg.Worker, Generation: c.gen.Load(), Version: step,
			Tables: []*pb.RowBlock{blk}}
		resp, err := c.cfg.Shards[p.shard].PushRows(ctx, req)
		if err != nil {
			return fmt.Errorf("push of %d rows of %s: %w", len(ks), table, err)
		}
		c.count(p.shard, 0, len(ks), keyBytes+len(blk.Values), 0, resp.Outcome == pb.PushResponse_STALE)
		if resp.Done {
			return ErrDone
		}
		return nil
	})
}

// keyBlock is a request's block of keys, in whichever of the two
// encodings is smaller (varints while every key is below 2^49, at most
// 7 bytes each; else 8 bytes each), and the keys' bytes.
func keyBlock(table string, keys []uint64) (*pb.RowBlock, int) {
	n := 0
	for _, k := range keys {
		if k >= 1<<49 {
			return &pb.RowBlock{Table: table, Keys: keys}, 8 * len(keys)
		}
		n += protowire.SizeVarint(k)
	}
	return &pb.RowBlock{Table: table, SmallKeys: keys}, n
}

// count records one request to shard.
func (c *Client) count(shard, pulled, pushed, sent, received int, stale bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.KeysPulled[shard] += int64(pulled)
	c.stats.KeysPushed[shard] += int64(pushed)
	c.stats.Requests[shard]++
	c.stats.BytesSent += int64(sent)
	c.stats.BytesReceived += int64(received)
	if stale {
		c.stats.Stale++
	}
}
