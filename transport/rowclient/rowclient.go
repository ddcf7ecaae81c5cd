// Package rowclient reads and trains embedding rows held by parameter
// servers: Client implements embed.MultiRows over N shards. A call's
// unique keys, of one table or of several (PullTables, PushTables: a
// CTR step's every table), are split by embed.ShardOf, each shard's
// share is sent in requests of at most MaxRequestBytes of rows (one
// after the other; a request carries several tables' blocks), the
// shards are called in parallel, and the rows come back in the keys'
// order. The step is the version the rows are read at (a sync pull waits
// for the shard to reach it) and the version a push's gradients come
// from.
//
// In sync mode a worker pushes a step's rows before the step's dense
// gradient: the shard applies the rows its workers pushed when the dense
// step completes, and drops later ones as stale. StageTables makes a
// push's requests without sending them, for a worker that sends each
// shard's ahead of its dense push on one connection.
package rowclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/pstrain/pstrain/ml/embed"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// DefaultMaxRequestBytes bounds a request's rows (or a response's): far
// below a PS's message limit (an Init of the dense model plus 1 MiB).
const DefaultMaxRequestBytes = 512 << 10

// ErrDone is returned when a shard says training is over (to a worker's
// client: the chief's reads the final model's rows).
var ErrDone = errors.New("rowclient: training is over")

// Shard is how a Client reaches one parameter server's rows: its gRPC
// client (pb.ParameterServerClient), or its data plane
// (dataplane.Client).
type Shard interface {
	PullRows(ctx context.Context, in *pb.PullRowsRequest, opts ...grpc.CallOption) (*pb.PullRowsResponse, error)
	PushRows(ctx context.Context, in *pb.PushRowsRequest, opts ...grpc.CallOption) (*pb.PushRowsResponse, error)
}

// Placer is a Shard that can hand a pull's answer to a function while
// its rows are still in the shard client's buffers (dataplane.Client):
// the rows are then copied once, into the caller's.
type Placer interface {
	PullRowsPlaced(ctx context.Context, in *pb.PullRowsRequest, place func(*pb.PullRowsResponse) error) error
}

// PullPlaced pulls in's rows from shard and hands the answer to place:
// while its rows are still in the shard client's buffers if it is a
// Placer, else the answer PullRows returns. An error of place is the
// call's.
func PullPlaced(ctx context.Context, shard Shard, in *pb.PullRowsRequest, place func(*pb.PullRowsResponse) error) error {
	if p, ok := shard.(Placer); ok {
		return p.PullRowsPlaced(ctx, in, place)
	}
	resp, err := shard.PullRows(ctx, in)
	if err != nil {
		return err
	}
	return place(resp)
}

// Config is what a Client needs.
type Config struct {
	// Shards are the parameter servers, by shard index.
	Shards []Shard
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

var _ embed.MultiRows = (*Client)(nil)

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

// block is one table's keys in a request: their indices in that
// table's keys of the call.
type block struct {
	t   int // the table's index in the call
	idx []int
}

// request is one request to a shard: blocks of one or more tables.
type request struct {
	shard  int
	blocks []block
}

// keys is how many keys the request carries.
func (r request) keys() int {
	n := 0
	for _, b := range r.blocks {
		n += len(b.idx)
	}
	return n
}

// split cuts a call's keys into requests: by shard, each of at most
// maxBytes of rows (a key and its row, dims[t] values, cost 8 + 4 x
// dims[t]; at least one key), the tables in the call's order and a
// table's keys in theirs.
func split(tables []embed.TableRows, dims []int, shards, maxBytes int) [][]request {
	byShard := keysByShard(tables, shards)
	out := make([][]request, shards)
	for s := range out {
		var cur request
		room := maxBytes
		for t := range tables {
			cost := 8 + 4*dims[t]
			idx := byShard[t][s]
			for len(idx) > 0 {
				if room < cost && len(cur.blocks) > 0 {
					out[s] = append(out[s], request{shard: s, blocks: cur.blocks})
					cur, room = request{}, maxBytes
				}
				n := min(len(idx), max(1, room/cost))
				cur.blocks = append(cur.blocks, block{t: t, idx: idx[:n]})
				idx, room = idx[n:], room-n*cost
			}
		}
		if len(cur.blocks) > 0 {
			out[s] = append(out[s], request{shard: s, blocks: cur.blocks})
		}
	}
	return out
}

// keysByShard is, by table and shard, the indices of the table's keys
// that shard holds (each key hashed once), in the keys' order; the
// indices of a table share one array.
func keysByShard(tables []embed.TableRows, shards int) [][][]int {
	out := make([][][]int, len(tables))
	of := []int32{}
	for t, tr := range tables {
		of = slices.Grow(of[:0], len(tr.Keys))[:len(tr.Keys)]
		counts := make([]int, shards)
		place := embed.PlacerOf(tr.Table, shards)
		for i, k := range tr.Keys {
			s := place.Shard(k)
			of[i] = int32(s)
			counts[s]++
		}
		all := make([]int, len(tr.Keys))
		out[t] = make([][]int, shards)
		at := 0
		for s, n := range counts {
			out[t][s] = all[at : at : at+n]
			at += n
		}
		for i := range tr.Keys {
			s := of[i]
			out[t][s] = append(out[t][s], i)
		}
	}
	return out
}

// dimsOf checks a call's shapes and returns each table's rows'
// dimension (0: no keys).
func dimsOf(tables []embed.TableRows) ([]int, error) {
	dims := make([]int, len(tables))
	for t, tr := range tables {
		if len(tr.Keys) == 0 {
			if len(tr.Rows) != 0 {
				return nil, fmt.Errorf("rowclient: %s: %d values for no keys", tr.Table, len(tr.Rows))
			}
			continue
		}
		if len(tr.Rows) == 0 || len(tr.Rows)%len(tr.Keys) != 0 {
			return nil, fmt.Errorf("rowclient: %s: %d values for %d keys", tr.Table, len(tr.Rows), len(tr.Keys))
		}
		dims[t] = len(tr.Rows) / len(tr.Keys)
	}
	return dims, nil
}

// each runs do on every shard's requests in parallel (a shard's
// requests one after the other, each retried alone by Config.Retry) and
// returns the first error: the first failure cancels the calls still
// going to the other shards, whose errors are then only that.
func (c *Client) each(ctx context.Context, reqs [][]request, do func(context.Context, request) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for s, rs := range reqs {
		if len(rs) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range rs {
				if err := c.attempt(ctx, r, do); err != nil {
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

// attempt makes request r, through Config.Retry if set.
func (c *Client) attempt(ctx context.Context, r request, do func(context.Context, request) error) error {
	call := func(ctx context.Context) error { return do(ctx, r) }
	if c.cfg.Retry == nil {
		return call(ctx)
	}
	return c.cfg.Retry(ctx, call)
}

// Pull implements embed.Rows: keys' rows into out, read at version step.
func (c *Client) Pull(ctx context.Context, step int64, table string, keys []uint64, out []float32) error {
	return c.PullTables(ctx, step, []embed.TableRows{{Table: table, Keys: keys, Rows: out}})
}

// Push implements embed.Rows: the gradients of keys' rows, computed from
// the rows at version step.
func (c *Client) Push(ctx context.Context, step int64, table string, keys []uint64, grads []float32) error {
	return c.PushTables(ctx, step, []embed.TableRows{{Table: table, Keys: keys, Rows: grads}})
}

// blocksOf is request r's blocks of keys (and with grads, their
// gradients), and the keys' bytes.
func blocksOf(tables []embed.TableRows, dims []int, r request, grads bool) ([]*pb.RowBlock, int) {
	blks := make([]*pb.RowBlock, len(r.blocks))
	nk, nv := 0, 0
	for _, b := range r.blocks {
		nk, nv = nk+len(b.idx), nv+len(b.idx)*dims[b.t]
	}
	allKeys := make([]uint64, nk) // (one array for every block's keys, one for their gradients)
	var allGrads []float32
	if grads {
		allGrads = make([]float32, nv)
	}
	keyBytes := 0
	for i, b := range r.blocks {
		tr, d := tables[b.t], dims[b.t]
		ks := allKeys[:len(b.idx):len(b.idx)]
		allKeys = allKeys[len(b.idx):]
		var gs []float32
		if grads {
			gs = allGrads[: 0 : len(b.idx)*d]
			allGrads = allGrads[len(b.idx)*d:]
		}
		for j, k := range b.idx {
			ks[j] = tr.Keys[k]
			if grads {
				gs = append(gs, tr.Rows[k*d:(k+1)*d]...)
			}
		}
		blk, kb := keyBlock(tr.Table, ks)
		if grads {
			blk.Values = wire.Bytes(gs)
		}
		blks[i], keyBytes = blk, keyBytes+kb
	}
	return blks, keyBytes
}

// PullTables implements embed.MultiRows: every table's keys' rows, read
// at version step, in one request per shard (more when a shard's share
// is over MaxRequestBytes).
func (c *Client) PullTables(ctx context.Context, step int64, tables []embed.TableRows) error {
	dims, err := dimsOf(tables)
	if err != nil {
		return err
	}
	reqs := split(tables, dims, len(c.cfg.Shards), c.cfg.MaxRequestBytes)
	return c.each(ctx, reqs, func(ctx context.Context, r request) error {
		blks, keyBytes := blocksOf(tables, dims, r, false)
		req := &pb.PullRowsRequest{RunId: c.cfg.RunID, Worker: c.cfg.Worker, Generation: c.gen.Load(), MinVersion: step, Tables: blks}
		var got int
		done := false
		place := func(resp *pb.PullRowsResponse) error {
			var err error
			got, err = placeRows(tables, dims, r, resp.Tables)
			done = resp.Done
			return err
		}
		if err := PullPlaced(ctx, c.cfg.Shards[r.shard], req, place); err != nil {
			return fmt.Errorf("pull of %d rows of %s: %w", r.keys(), describe(tables, r), err)
		}
		c.count(r.shard, r.keys(), 0, keyBytes, got, false)
		if done && c.cfg.Worker >= 0 { // the chief reads the final model's rows
			return ErrDone
		}
		return nil
	})
}

// placeRows copies a pull's answer into the call's rows and returns its
// bytes.
func placeRows(tables []embed.TableRows, dims []int, r request, ans []*pb.RowBlock) (int, error) {
	if len(ans) != len(r.blocks) {
		return 0, fmt.Errorf("pull of %s: answered with %d blocks, want %d", describe(tables, r), len(ans), len(r.blocks))
	}
	got := 0
	for i, b := range r.blocks {
		tr, d := tables[b.t], dims[b.t]
		if len(ans[i].Values) != len(b.idx)*d*4 {
			return 0, fmt.Errorf("pull of %d rows of %s of dimension %d: answered with %d bytes, want %d", len(b.idx), tr.Table, d, len(ans[i].Values), len(b.idx)*d*4)
		}
		rows, err := wire.Floats(ans[i].Values)
		if err != nil {
			return 0, err
		}
		for j, k := range b.idx {
			copy(tr.Rows[k*d:(k+1)*d], rows[j*d:(j+1)*d])
		}
		got += len(ans[i].Values)
	}
	return got, nil
}

// PushTables implements embed.MultiRows: every table's keys' gradients,
// computed from the rows at version step, in one request per shard
// (more when a shard's share is over MaxRequestBytes).
func (c *Client) PushTables(ctx context.Context, step int64, tables []embed.TableRows) error {
	dims, err := dimsOf(tables)
	if err != nil {
		return err
	}
	reqs := split(tables, dims, len(c.cfg.Shards), c.cfg.MaxRequestBytes)
	return c.each(ctx, reqs, func(ctx context.Context, r request) error {
		req, sent := c.pushRequest(step, tables, dims, r)
		resp, err := c.cfg.Shards[r.shard].PushRows(ctx, req)
		if err != nil {
			return fmt.Errorf("push of %d rows of %s: %w", r.keys(), describe(tables, r), err)
		}
		return c.pushed(r.shard, r.keys(), sent, resp)
	})
}

// pushRequest is request r of a push of tables' gradients from version
// step, and the bytes of its keys and values.
func (c *Client) pushRequest(step int64, tables []embed.TableRows, dims []int, r request) (*pb.PushRowsRequest, int) {
	blks, sent := blocksOf(tables, dims, r, true)
	for _, b := range blks {
		sent += len(b.Values)
	}
	return &pb.PushRowsRequest{RunId: c.cfg.RunID, Worker: c.cfg.Worker, Generation: c.gen.Load(), Version: step, Tables: blks}, sent
}

// pushed records a shard's answer to a push request of keys keys and
// sent bytes: ErrDone if it says training is over.
func (c *Client) pushed(shard, keys, sent int, resp *pb.PushRowsResponse) error {
	c.count(shard, 0, keys, sent, 0, resp.Outcome == pb.PushResponse_STALE)
	if resp.Done {
		return ErrDone
	}
	return nil
}

// Staged is a push of row gradients cut into each shard's requests
// (as PushTables cuts them) and not sent: a worker sends each shard's
// with its dense push of the step, on the same connection and before
// it (dataplane.Client.PushAfterRows), which saves the round trip of a
// push of their own.
type Staged struct {
	c    *Client
	reqs [][]*pb.PushRowsRequest // by shard
	keys [][]int                 // by shard and request: its keys
	sent [][]int                 // and its bytes
}

// StageTables is PushTables, its requests made but not sent. Their keys
// and values are copies: tables may change once it returns.
func (c *Client) StageTables(step int64, tables []embed.TableRows) (*Staged, error) {
	dims, err := dimsOf(tables)
	if err != nil {
		return nil, err
	}
	n := len(c.cfg.Shards)
	st := &Staged{c: c, reqs: make([][]*pb.PushRowsRequest, n), keys: make([][]int, n), sent: make([][]int, n)}
	for s, rs := range split(tables, dims, n, c.cfg.MaxRequestBytes) {
		for _, r := range rs {
			req, sent := c.pushRequest(step, tables, dims, r)
			st.reqs[s] = append(st.reqs[s], req)
			st.keys[s] = append(st.keys[s], r.keys())
			st.sent[s] = append(st.sent[s], sent)
		}
	}
	return st, nil
}

// Requests is shard's requests, in order (none, or a shard past the
// client's: nil).
func (st *Staged) Requests(shard int) []*pb.PushRowsRequest {
	if shard < 0 || shard >= len(st.reqs) {
		return nil
	}
	return st.reqs[shard]
}

// Answered records the answer to shard's request i: ErrDone if it
// says training is over.
func (st *Staged) Answered(shard, i int, resp *pb.PushRowsResponse) error {
	return st.c.pushed(shard, st.keys[shard][i], st.sent[shard][i], resp)
}

// describe names a request's tables ("emb/C1", or "emb/C1 and 25 more").
func describe(tables []embed.TableRows, r request) string {
	if len(r.blocks) == 0 {
		return "no table"
	}
	name := tables[r.blocks[0].t].Table
	if n := len(r.blocks) - 1; n > 0 {
		return fmt.Sprintf("%s and %d more", name, n)
	}
	return name
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
