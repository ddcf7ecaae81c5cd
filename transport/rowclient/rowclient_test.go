package rowclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"math/rand"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/dataplane"
	"github.com/pstrain/pstrain/transport/wire"
)

// shardProc is one PS served over gRPC on an in-memory listener, and
// its data plane on a loopback one.
type shardProc struct {
	srv      *ps.Server
	m        *metrics.PS
	lis      *bufconn.Listener
	dataAddr string
}

// cluster is 2 shards and the run's keys; clients sign calls as who.
type cluster struct {
	shards []*shardProc
	keys   *auth.Keyring
	plan   partition.Plan
	store  *checkpoint.Store // the shards' shared checkpoint directory
	// rowsLoading makes the Inits say the chief loads rows next.
	rowsLoading bool
}

func startShards(t testing.TB, n int) *cluster {
	t.Helper()
	token, err := auth.NewToken(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{keys: auth.NewKeyring(token), store: checkpoint.NewStore(checkpoint.NewMemFS(), "/ck", 0)}
	for i := range n {
		p := &shardProc{m: metrics.NewPS(nil), lis: bufconn.Listen(1 << 20)}
		p.srv = ps.NewServer(ps.Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: p.m, Shard: i, Store: c.store})
		g := grpc.NewServer(grpc.ChainUnaryInterceptor((&auth.Guard{Keys: c.keys}).Unary()))
		pb.RegisterParameterServerServer(g, p.srv)
		go func() { _ = g.Serve(p.lis) }()
		t.Cleanup(g.Stop)
		dl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ds := dataplane.NewServer(p.srv, dl, dataplane.Config{MaxPayload: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Auth: c.keys})
		served := make(chan struct{})
		go func() { _ = ds.Serve(); close(served) }()
		t.Cleanup(func() { ds.Close(); <-served })
		p.dataAddr = dl.Addr().String()
		c.shards = append(c.shards, p)
	}
	return c
}

// session is a new session of role/index with the cluster's keys.
func (c *cluster) session(t testing.TB, role string, index int) *auth.Client {
	t.Helper()
	s, err := auth.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	who := &auth.Client{Keys: c.keys, Role: role, Index: index}
	who.SetSession(s)
	return who
}

// clients returns a client of every shard signed as role/index.
func (c *cluster) clients(t testing.TB, role string, index int) []pb.ParameterServerClient {
	t.Helper()
	who := c.session(t, role, index)
	var out []pb.ParameterServerClient
	for _, p := range c.shards {
		conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return p.lis.DialContext(ctx) }),
			grpc.WithChainUnaryInterceptor(who.Unary()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		out = append(out, pb.NewParameterServerClient(conn))
	}
	return out
}

// dataClients returns a data-plane client of every shard signed as
// role/index, as its rows' Shard.
func (c *cluster) dataClients(t testing.TB, role string, index int) []Shard {
	t.Helper()
	who := c.session(t, role, index)
	var out []Shard
	for _, p := range c.shards {
		dc := dataplane.NewClient(func(context.Context) (string, error) { return p.dataAddr, nil }, nil, 1<<20)
		dc.SignWith(who)
		t.Cleanup(func() { dc.Close() })
		out = append(out, dc)
	}
	return out
}

// init initialises every shard (sync, 2 workers) with tables.
func (c *cluster) init(t *testing.T, chief []pb.ParameterServerClient, tables []embed.TableConfig) {
	t.Helper()
	c.initMode(t, chief, tables, config.Sync)
}

// initMode initialises every shard (2 workers) in mode with tables.
func (c *cluster) initMode(t testing.TB, chief []pb.ParameterServerClient, tables []embed.TableConfig, mode config.Mode) {
	t.Helper()
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, len(c.shards))
	if err != nil {
		t.Fatal(err)
	}
	c.plan = plan
	r := config.Default()
	r.Workers, r.PS, r.LRSchedule, r.Mode = 2, len(c.shards), "constant", mode
	for s, cl := range chief {
		_, err := cl.Init(context.Background(), &pb.InitRequest{RunId: "r", Shard: int32(s), NumShards: int32(len(c.shards)),
			ShardOptions: ps.OptionsFor(r).Proto(), Params: wire.Bytes(make([]float32, plan.Shards[s].Size)),
			ModelSpec: convert.ModelSpec(spec), Generation: 1, Tables: ps.TableSpecs(tables), RowsLoading: c.rowsLoading})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// densePush pushes worker's zero dense gradient of version v to every
// shard (completing the sync step once both workers have).
func (c *cluster) densePush(t *testing.T, cls []pb.ParameterServerClient, worker int, v int64) {
	t.Helper()
	for s, cl := range cls {
		_, err := cl.Push(context.Background(), &pb.PushRequest{RunId: "r", Worker: int32(worker), Version: v,
			Grad: wire.Bytes(make([]float32, c.plan.Shards[s].Size))})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Two shards over real gRPC hold a table: workers pull and push rows
// through the client (several requests per shard), a sync step applies
// them as one big batch would, a pull of the next step waits for it, and
// every row is where ShardOf says, in the metrics and in the checkpoint.
// TestRowsOnTwoShards: a sync step's rows over gRPC and over the data
// plane (ops 4 and 5) alike.
func TestRowsOnTwoShards(t *testing.T) {
	t.Run("grpc", func(t *testing.T) {
		testRowsOnTwoShards(t, func(c *cluster, w int) []Shard { return shardsOf(c.clients(t, auth.RoleWorker, w)) })
	})
	t.Run("dataplane", func(t *testing.T) {
		testRowsOnTwoShards(t, func(c *cluster, w int) []Shard { return c.dataClients(t, auth.RoleWorker, w) })
	})
}

func testRowsOnTwoShards(t *testing.T, rowsOf func(c *cluster, w int) []Shard) {
	tables := []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 7, Rule: embed.DefaultAdagrad(0.5)}}
	c := startShards(t, 2)
	chief := c.clients(t, auth.RoleChief, 0)
	c.init(t, chief, tables)
	ctx := context.Background()
	keys := [][]uint64{{1, 2, 3, 5, 8, 13, 21, 34, 55, 89}, {2, 3, 4, 100, 1 << 40, 89}}
	local, _ := embed.NewLocal(tables)
	workers := make([]*Client, 2)
	wcl := make([][]pb.ParameterServerClient, 2)
	for w := range workers {
		wcl[w] = c.clients(t, auth.RoleWorker, w)
		cl, err := New(Config{Shards: rowsOf(c, w), RunID: "r", Worker: int32(w), MaxRequestBytes: 3 * 24})
		if err != nil {
			t.Fatal(err)
		}
		cl.SetGeneration(1)
		workers[w] = cl
	}
	// Step 0: each worker pulls its keys, pushes gradients (w+1 each).
	for w, cl := range workers {
		out := make([]float32, len(keys[w])*4)
		if err := cl.Pull(ctx, 0, "emb/C1", keys[w], out); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, len(out))
		_ = local.Pull(ctx, 0, "emb/C1", keys[w], want)
		if !slices.Equal(out, want) {
			t.Fatalf("worker %d pulled %v, want the initial rows %v", w, out, want)
		}
		if err := cl.Push(ctx, 0, "emb/C1", keys[w], filled(len(out), float32(w+1))); err != nil {
			t.Fatal(err)
		}
	}
	// Worker 0's pull of step 1 waits for the step to complete.
	next := make(chan error, 1)
	got := make([]float32, len(keys[0])*4)
	go func() { next <- workers[0].Pull(ctx, 1, "emb/C1", keys[0], got) }()
	select {
	case err := <-next:
		t.Fatalf("a pull of step 1 returned before the step completed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.densePush(t, wcl[0], 0, 0)
	c.densePush(t, wcl[1], 1, 0)
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	// One process, one batch of both workers' keys: the mean of their
	// gradients (a key one worker saw gets half its gradient).
	all := uniqueUnion(keys[0], keys[1])
	grads := make([]float32, len(all)*4)
	for i, k := range all {
		for w := range keys {
			if slices.Contains(keys[w], k) {
				for j := range 4 {
					grads[i*4+j] += float32(w+1) / 2
				}
			}
		}
	}
	if err := local.Push(ctx, 0, "emb/C1", all, grads); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, len(got))
	_ = local.Pull(ctx, 1, "emb/C1", keys[0], want)
	for i := range got {
		if math.Abs(float64(got[i]-want[i])) > 1e-6 {
			t.Fatalf("rows after the step %v, one big batch gives %v", got, want)
		}
	}
	st := workers[0].Stats()
	if st.Requests[0]+st.Requests[1] <= 4 || st.KeysPulled[0]+st.KeysPulled[1] != 2*int64(len(keys[0])) {
		t.Fatalf("worker 0's stats %+v: want several requests per shard (3 keys each) and every key pulled twice", st)
	}
	// Worker 0 pulled its keys twice and pushed them once: the shares
	// are its keys' split by ShardOf.
	var on0 float64
	for _, k := range keys[0] {
		if embed.ShardOf("emb/C1", k, 2) == 0 {
			on0++
		}
	}
	if sh := st.RequestShares(); math.Abs(sh[0]-on0/float64(len(keys[0]))) > 1e-12 || math.Abs(sh[0]+sh[1]-1) > 1e-12 {
		t.Fatalf("request shares %v, want shard 0's %v of %d keys", sh, on0, len(keys[0]))
	}
	checkPlacement(t, c, chief, all)
}

// commit commits m and opens the checkpoint.
func commit(t *testing.T, store *checkpoint.Store, m checkpoint.Manifest) *checkpoint.Checkpoint {
	t.Helper()
	if err := store.Commit(m); err != nil {
		t.Fatal(err)
	}
	ck, err := store.Load(store.Path(m.Step))
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

// checkpointAll checkpoints every shard as step and commits it.
func (c *cluster) checkpointAll(t *testing.T, chief []pb.ParameterServerClient, step int64) *checkpoint.Checkpoint {
	t.Helper()
	m := checkpoint.Manifest{Step: step, Version: step, Mode: "sync", NumShards: len(chief), Optimizer: checkpoint.Optimizer{Name: "sgd"}}
	for s, cl := range chief {
		resp, err := cl.Checkpoint(context.Background(), &pb.CheckpointRequest{RunId: "r", Step: step})
		if err != nil {
			t.Fatal(err)
		}
		m.Shards = append(m.Shards, checkpoint.ShardInfo{Index: s, File: resp.File, SHA256: resp.Sha256, Bytes: resp.Bytes,
			Tensors: resp.Tensors, Version: resp.Version})
	}
	return commit(t, c.store, m)
}

// trainStep is a sync step of both workers at version v: each pulls its
// keys' rows, pushes a gradient made of the rows, then its dense gradient.
func (c *cluster) trainStep(t *testing.T, wcl [][]pb.ParameterServerClient, v int64, keys [][]uint64) {
	t.Helper()
	for w := range wcl {
		cl, err := New(Config{Shards: shardsOf(wcl[w]), RunID: "r", Worker: int32(w)})
		if err != nil {
			t.Fatal(err)
		}
		rows := make([]float32, len(keys[w])*4)
		if err := cl.Pull(context.Background(), v, "emb/C1", keys[w], rows); err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			rows[i] = 1 + rows[i]*float32(w+1) // a gradient that depends on the row
		}
		if err := cl.Push(context.Background(), v, "emb/C1", keys[w], rows); err != nil {
			t.Fatal(err)
		}
	}
	for w := range wcl {
		c.densePush(t, wcl[w], w, v)
	}
}

// A checkpoint of 2 shards restores onto 3 (rows and optimizer state,
// each row on the shard ShardOf gives it): the 3 shards then serve and
// train every row as the 2 would have.
func TestCheckpointOfTwoShardsRestoresOntoThree(t *testing.T) {
	tables := []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 3, Rule: embed.DefaultAdagrad(0.2)}}
	keys := [][]uint64{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {10, 11, 12, 13, 14, 15, 99, 1 << 50}}
	all := uniqueUnion(keys[0], keys[1])
	two, three := startShards(t, 2), startShards(t, 3)
	chief2, chief3 := two.clients(t, auth.RoleChief, 0), three.clients(t, auth.RoleChief, 0)
	two.init(t, chief2, tables)
	three.rowsLoading = true // (a shard takes rows only while it loads them)
	three.init(t, chief3, tables)
	w2 := [][]pb.ParameterServerClient{two.clients(t, auth.RoleWorker, 0), two.clients(t, auth.RoleWorker, 1)}
	w3 := [][]pb.ParameterServerClient{three.clients(t, auth.RoleWorker, 0), three.clients(t, auth.RoleWorker, 1)}
	two.trainStep(t, w2, 0, keys)
	ck := two.checkpointAll(t, chief2, 1)
	if err := restoreAll(ck, chief3, 100); err != nil {
		t.Fatal(err)
	}
	for s, p := range three.shards {
		want := 0
		for _, k := range all {
			if embed.ShardOf("emb/C1", k, 3) == s {
				want++
			}
		}
		if got := testutil.ToFloat64(p.m.Tables.Rows.WithLabelValues("emb/C1")); got != float64(want) {
			t.Fatalf("shard %d of 3 holds %v rows, ShardOf gives it %d", s, got, want)
		}
	}
	// Train both once more (the 3 shards are at version 0, the 2 at 1):
	// equal rows need equal Adagrad accumulators.
	two.trainStep(t, w2, 1, keys)
	three.trainStep(t, w3, 0, keys)
	a, b := pullAll(t, chief2, 2, all), pullAll(t, chief3, 1, all)
	if !slices.Equal(a, b) {
		t.Fatalf("after the restore and a step, 3 shards hold %v, 2 shards %v", b, a)
	}
}

// pullAll reads keys' rows as the chief, at version v.
func pullAll(t *testing.T, chief []pb.ParameterServerClient, v int64, keys []uint64) []float32 {
	t.Helper()
	cl, err := New(Config{Shards: shardsOf(chief), RunID: "r", Worker: -1})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(keys)*4)
	if err := cl.Pull(context.Background(), v, "emb/C1", keys, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkPlacement checks each shard holds exactly the rows of keys that
// ShardOf gives it: in its metrics, in a checkpoint, and by refusing
// the others' keys.
func checkPlacement(t *testing.T, c *cluster, chief []pb.ParameterServerClient, keys []uint64) {
	t.Helper()
	m := checkpoint.Manifest{Step: 1, Version: 1, Mode: "sync", NumShards: 2, Optimizer: checkpoint.Optimizer{Name: "sgd"}}
	for s, cl := range chief {
		resp, err := cl.Checkpoint(context.Background(), &pb.CheckpointRequest{RunId: "r", Step: 1})
		if err != nil {
			t.Fatal(err)
		}
		m.Shards = append(m.Shards, checkpoint.ShardInfo{Index: s, File: resp.File, SHA256: resp.Sha256, Bytes: resp.Bytes,
			Tensors: resp.Tensors, Version: resp.Version})
	}
	ck := commit(t, c.store, m)
	for s, p := range c.shards {
		var mine []uint64
		for _, k := range keys {
			if embed.ShardOf("emb/C1", k, 2) == s {
				mine = append(mine, k)
			}
		}
		slices.Sort(mine)
		if got := testutil.ToFloat64(p.m.Tables.Rows.WithLabelValues("emb/C1")); got != float64(len(mine)) || len(mine) == 0 {
			t.Fatalf("shard %d: pstrain_ps_table_rows %v, ShardOf gives it %d keys", s, got, len(mine))
		}
		tensors, _, err := ck.ReadShard(s)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := shardckpt.TablesOf(tensors, m.Shards[s].File)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || !slices.Equal(rows[0].Keys, mine) {
			t.Fatalf("shard %d's checkpoint holds %+v, want the keys %v", s, rows, mine)
		}
		other := keys[slices.IndexFunc(keys, func(k uint64) bool { return embed.ShardOf("emb/C1", k, 2) != s })]
		_, err = chief[s].PullRows(context.Background(), &pb.PullRowsRequest{RunId: "r", Worker: -1,
			Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{other}}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "another shard") {
			t.Fatalf("shard %d pulled another shard's key: %v", s, err)
		}
	}
}

func TestClientRefusesBadShapesAndReportsDone(t *testing.T) {
	c := startShards(t, 2)
	chief := c.clients(t, auth.RoleChief, 0)
	c.init(t, chief, []embed.TableConfig{{Name: "emb/C1", Dim: 2, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}})
	cl, err := New(Config{Shards: shardsOf(c.clients(t, auth.RoleWorker, 0)), RunID: "r", Worker: 0})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Pull(context.Background(), 0, "emb/C1", []uint64{1, 2}, make([]float32, 3)); err == nil {
		t.Fatal("3 values for 2 keys accepted")
	}
	if err := cl.Pull(context.Background(), 0, "emb/C9", []uint64{1, 2}, make([]float32, 4)); status.Code(err) != codes.InvalidArgument || !strings.Contains(fmtErr(err), "no such table") {
		t.Fatalf("pull of an unknown table: %v", err)
	}
	// Another worker's identity is refused by the PS's guard.
	spoof, _ := New(Config{Shards: shardsOf(c.clients(t, auth.RoleWorker, 1)), RunID: "r", Worker: 0})
	if err := spoof.Push(context.Background(), 0, "emb/C1", []uint64{1}, []float32{1, 1}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("worker 1 pushing as worker 0: %v", err)
	}
	for _, p := range chief {
		if _, err := p.Stop(context.Background(), &pb.StopRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Pull(context.Background(), 5, "emb/C1", []uint64{1, 2}, make([]float32, 4)); !errors.Is(err, ErrDone) {
		t.Fatalf("pull after the stop: %v, want ErrDone", err)
	}
}

func filled(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func uniqueUnion(a, b []uint64) []uint64 {
	out := slices.Clone(a)
	for _, k := range b {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Async: two workers pull and push rows and dense gradients at once, for
// many steps; every row gradient is applied once on arrival, whatever
// the interleaving (SGD, lr 1, gradient 1: a row ends at its initial
// value minus its pushes).
func TestAsyncRowsFromConcurrentWorkers(t *testing.T) {
	tables := []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 2, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	c := startShards(t, 2)
	chief := c.clients(t, auth.RoleChief, 0)
	c.initMode(t, chief, tables, config.Async)
	keys := [][]uint64{{1, 2, 3, 4, 5, 6}, {4, 5, 6, 7, 8}}
	const steps = 20
	errs := make(chan error, 2)
	for w := range 2 {
		cls := c.clients(t, auth.RoleWorker, w)
		go func() {
			cl, err := New(Config{Shards: shardsOf(cls), RunID: "r", Worker: int32(w), MaxRequestBytes: 2 * 24})
			for v := int64(0); err == nil && v < steps; v++ {
				rows := make([]float32, len(keys[w])*4)
				if err = cl.Pull(context.Background(), v, "emb/C1", keys[w], rows); err == nil {
					err = cl.Push(context.Background(), v, "emb/C1", keys[w], filled(len(rows), 1))
				}
				for s, p := range cls {
					if err != nil {
						break
					}
					_, err = p.Push(context.Background(), &pb.PushRequest{RunId: "r", Worker: int32(w), Version: 0,
						Grad: wire.Bytes(make([]float32, c.plan.Shards[s].Size))})
				}
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	all := uniqueUnion(keys[0], keys[1])
	got := pullAll(t, chief, 0, all)
	for i, k := range all {
		want := make([]float32, 4)
		embed.InitRow(2, "emb/C1", k, want)
		n := 0
		for w := range keys {
			if slices.Contains(keys[w], k) {
				n += steps
			}
		}
		for j := range want {
			for range n {
				want[j]--
			}
		}
		if !slices.Equal(got[i*4:(i+1)*4], want) {
			t.Fatalf("key %d: %v, want its initial row minus %d pushes %v", k, got[i*4:(i+1)*4], n, want)
		}
	}
}

// BenchmarkPullPushRows is a worker's row traffic of one step on one
// table over 2 shards (gRPC in memory, async): a pull and a push of 5000
// unique keys of dimension 16 (the 26 fields of a batch of 512 Zipf
// samples give about that many), keys of a 10^6 vocabulary.
func BenchmarkPullPushRows(b *testing.B) {
	t := b
	tables := []embed.TableConfig{{Name: "emb/C1", Dim: 16, Seed: 2, Rule: embed.DefaultAdagrad(0.1)}}
	c := startShards(t, 2)
	chief := c.clients(t, auth.RoleChief, 0)
	c.initMode(t, chief, tables, config.Async)
	cl, err := New(Config{Shards: shardsOf(c.clients(t, auth.RoleWorker, 0)), RunID: "r", Worker: 0})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	seen := map[uint64]bool{}
	keys := make([]uint64, 0, 5000)
	for len(keys) < cap(keys) {
		if k := uint64(rng.Int63n(1e6)); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	rows, grads := make([]float32, len(keys)*16), filled(len(keys)*16, 0.01)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if err := cl.Pull(ctx, 0, "emb/C1", keys, rows); err != nil {
			b.Fatal(err)
		}
		if err := cl.Push(ctx, 0, "emb/C1", keys, grads); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st := cl.Stats()
	b.ReportMetric(float64(st.BytesSent+st.BytesReceived)/float64(b.N), "rowbytes/op")
}

func TestKeysTravelInTheSmallerEncoding(t *testing.T) {
	b, n := keyBlock("emb/C1", []uint64{1, 300, 1 << 40})
	if len(b.SmallKeys) != 3 || len(b.Keys) != 0 || n != 1+2+6 {
		t.Fatalf("small keys sent as %+v (%d bytes)", b, n)
	}
	b, n = keyBlock("emb/C1", []uint64{1, 1 << 49})
	if len(b.Keys) != 2 || len(b.SmallKeys) != 0 || n != 16 {
		t.Fatalf("a key of 2^49 sent as %+v (%d bytes)", b, n)
	}
	// A block with both is refused by the shard.
	c := startShards(t, 1)
	chief := c.clients(t, auth.RoleChief, 0)
	c.init(t, chief, []embed.TableConfig{{Name: "emb/C1", Dim: 1, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}})
	_, err := chief[0].PullRows(context.Background(), &pb.PullRowsRequest{RunId: "r", Worker: -1,
		Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{1}, SmallKeys: []uint64{2}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a block with keys in both fields: %v", err)
	}
}

// A quarantined worker's row gradients are dropped, as its dense ones.
func TestQuarantinedWorkerRowsAreDropped(t *testing.T) {
	c := startShards(t, 1)
	chief := c.clients(t, auth.RoleChief, 0)
	c.initMode(t, chief, []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}, config.Async)
	if _, err := chief[0].SetMembership(context.Background(), &pb.MembershipRequest{LiveWorkers: []int32{0, 1}, Quarantined: []int32{1}}); err != nil {
		t.Fatal(err)
	}
	bad, _ := New(Config{Shards: shardsOf(c.clients(t, auth.RoleWorker, 1)), RunID: "r", Worker: 1})
	row := make([]float32, 4)
	if err := bad.Pull(context.Background(), 0, "emb/C1", []uint64{7}, row); err != nil {
		t.Fatal(err)
	}
	if err := bad.Push(context.Background(), 0, "emb/C1", []uint64{7}, filled(4, 5)); err != nil {
		t.Fatal(err)
	}
	if after := pullAll(t, chief, 0, []uint64{7}); !slices.Equal(after, row) || bad.Stats().Stale != 1 {
		t.Fatalf("a quarantined worker's push moved the row from %v to %v (stale pushes %d)", row, after, bad.Stats().Stale)
	}
}

// RestoreShard loads the rows of its shard only: a shard
// re-initialised alone (a restarted PS) gets its rows back, the others
// are left as they are.
func TestRestoreShardLoadsItsShardOnly(t *testing.T) {
	tables := []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 3, Rule: embed.DefaultAdagrad(0.2)}}
	keys := [][]uint64{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {10, 11, 12, 13, 14, 15, 99, 1 << 50}}
	all := uniqueUnion(keys[0], keys[1])
	src, dst := startShards(t, 2), startShards(t, 2)
	chiefSrc, chiefDst := src.clients(t, auth.RoleChief, 0), dst.clients(t, auth.RoleChief, 0)
	src.init(t, chiefSrc, tables)
	dst.rowsLoading = true
	dst.init(t, chiefDst, tables)
	w := [][]pb.ParameterServerClient{src.clients(t, auth.RoleWorker, 0), src.clients(t, auth.RoleWorker, 1)}
	src.trainStep(t, w, 0, keys)
	ck := src.checkpointAll(t, chiefSrc, 1)
	if err := RestoreShard(context.Background(), ck, chiefDst[1], 1, 2, "r", 1, 100); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, k := range all {
		if embed.ShardOf("emb/C1", k, 2) == 1 {
			want++
		}
	}
	for s, p := range dst.shards {
		got := testutil.ToFloat64(p.m.Tables.Rows.WithLabelValues("emb/C1"))
		if s == 0 && got != 0 || s == 1 && (got != float64(want) || want == 0) {
			t.Errorf("shard %d holds %v rows after restoring shard 1 of %d rows", s, got, want)
		}
	}
	if err := RestoreShard(context.Background(), ck, chiefDst[0], 2, 2, "r", 1, 100); err == nil {
		t.Error("restoring shard 2 of 2 did not fail")
	}
}

// A shard told that the chief loads a checkpoint's rows answers row
// requests Unavailable (which workers retry) until the restore's last
// LoadRows: no worker reads, and creates, a row the checkpoint holds.
func TestRowsWaitForTheirRestore(t *testing.T) {
	tables := []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 3, Rule: embed.DefaultAdagrad(0.2)}}
	keys := [][]uint64{{1, 2, 3, 4}, {3, 4, 5, 6}}
	src, dst := startShards(t, 2), startShards(t, 2)
	chiefSrc, chiefDst := src.clients(t, auth.RoleChief, 0), dst.clients(t, auth.RoleChief, 0)
	src.init(t, chiefSrc, tables)
	w := [][]pb.ParameterServerClient{src.clients(t, auth.RoleWorker, 0), src.clients(t, auth.RoleWorker, 1)}
	src.trainStep(t, w, 0, keys)
	ck := src.checkpointAll(t, chiefSrc, 1)
	dst.rowsLoading = true
	dst.init(t, chiefDst, tables)
	cl, err := New(Config{Shards: shardsOf(dst.clients(t, auth.RoleWorker, 0)), RunID: "r", Worker: 0})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 4*4)
	if err := cl.Pull(context.Background(), 0, "emb/C1", keys[0], out); status.Code(err) != codes.Unavailable {
		t.Fatalf("a pull before the rows are restored: %v, want Unavailable", err)
	}
	if err := restoreAll(ck, chiefDst, 0); err != nil {
		t.Fatal(err)
	}
	if err := cl.Pull(context.Background(), 0, "emb/C1", keys[0], out); err != nil {
		t.Fatalf("a pull after the restore: %v", err)
	}
	if want := pullAll(t, chiefSrc, 1, keys[0]); !slices.Equal(out, want) {
		t.Fatalf("restored rows %v, want the checkpoint's %v", out, want)
	}
}

// restoreAll restores ck's rows onto every shard, as a chief resuming a
// run of run "r" at generation 1 does.
func restoreAll(ck *checkpoint.Checkpoint, shards []pb.ParameterServerClient, maxBytes int) error {
	for s, cl := range shards {
		if err := RestoreShard(context.Background(), ck, cl, s, len(shards), "r", 1, maxBytes); err != nil {
			return err
		}
	}
	return nil
}

// shardsOf is gRPC clients as a Client's shards.
func shardsOf(cls []pb.ParameterServerClient) []Shard {
	out := make([]Shard, len(cls))
	for i, c := range cls {
		out[i] = c
	}
	return out
}
