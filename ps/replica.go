package ps

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// Hot standbys (--ps-replicas 1; docs/replication.md). A primary forwards
// every update it applies — pushes, membership changes, the stop — in the
// order it applied them, to its standby, which applies them to a copy of
// the same state machine; the copy started from a snapshot of the
// primary's whole state. A push is answered, and a version shown to a
// pull, only once the standby has acknowledged it; so when the chief
// promotes the standby it holds every acknowledged update, and the
// updates it lacks were never acknowledged: their workers send them again.

// Replica roles (StatusResponse.role).
const (
	roleNone    = ""        // no state yet
	rolePrimary = "primary" // serves workers
	roleStandby = "standby" // applies its primary's updates
	roleDeposed = "deposed" // a primary a newer epoch replaced: serves nobody
)

var allRoles = []string{roleNone, rolePrimary, roleStandby, roleDeposed}

// ReplicaClient is what a primary calls on its standby: the gRPC
// client of its ParameterServer service, or one whose Replicate goes
// over the standby's data plane (task: --data-plane tcp).
type ReplicaClient interface {
	Replicate(ctx context.Context, in *pb.ReplicaBatch, opts ...grpc.CallOption) (*pb.ReplicaAck, error)
}

// ReplicaDialer connects to the standby at addr (its gRPC address): a
// client and the function that closes its connections.
type ReplicaDialer func(ctx context.Context, addr string) (ReplicaClient, func() error, error)

// Replication's timing.
const (
	// replicaCallTimeout bounds one Replicate call.
	replicaCallTimeout = 5 * time.Second
	// replicaAckTimeout bounds how long a push waits for its standby's
	// acknowledgement before it is refused as Unavailable (the worker
	// sends it again; the chief drops or replaces a standby that died
	// well within it).
	replicaAckTimeout = 20 * time.Second
	// stopReplicaWait bounds how long a Stop waits for its standby.
	stopReplicaWait   = 2 * time.Second
	replicaRetryFirst = 10 * time.Millisecond
	replicaRetryMax   = 200 * time.Millisecond
	// lagRefresh is how often a link sets its lag gauges anew between
	// the updates and acknowledgements that set them: a standby that
	// stops acknowledging shows a lag that grows, not the last one it
	// had.
	lagRefresh = time.Second
)

// Close stops the server's background work (a standby link). It does
// not stop serving.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopReplica()
}

// setRole records the process's role, in Status and the metrics. Call
// with mu held.
func (s *Server) setRole(r string) {
	s.role = r
	for _, x := range allRoles {
		v := 0.0
		if x == r {
			v = 1
		}
		name := x
		if name == roleNone {
			name = "none"
		}
		s.m.ReplicaRole.WithLabelValues(name).Set(v)
	}
	s.tables.setRole(s.serving(), r == roleStandby)
}

// serving refuses a worker's (or the chief's) request to a process that
// does not serve its shard. Call with mu held.
func (s *Server) serving() error {
	switch s.role {
	case roleStandby:
		return status.Errorf(codes.Unavailable, "ps: shard %d here is a standby: its primary serves workers", s.index)
	case roleDeposed:
		return status.Errorf(codes.Unavailable, "ps: shard %d here is deposed (a standby was promoted at a newer epoch): its new primary serves workers", s.index)
	}
	return nil
}

// replicator is a primary's link to its standby. One goroutine
// (runReplica) sends the queued operations in order, in batches, and
// retries a batch until the standby acknowledges it or the link is
// stopped; the fields below the channels are guarded by Server.mu.
type replicator struct {
	addr  string
	epoch int64
	stop  chan struct{} // closed: the link is dropped
	wake  chan struct{} // an operation was queued

	queue  []*pb.ReplicaOp // not yet acknowledged, in order: the first is acked+1
	queued []time.Time     // when each queued operation was applied
	// release[i], if not nil, gives back the buffer queue[i] holds (a
	// push's, lent by the data plane: PushKept) once the standby holds
	// it or the link's goroutine is done.
	release      []func()
	first        int64 // the link's first sequence number (its snapshot's)
	nextSeq      int64 // the next operation's sequence number
	acked        int64 // the last operation the standby acknowledged
	ackedVersion int64 // the standby's version after it
	// snapAcked: the standby acknowledged the snapshot, when the
	// operations up to catchUp were queued (answered alone while the
	// snapshot travelled). From then on every update waits for the
	// standby; it is attached (may be promoted) once it holds catchUp.
	snapAcked bool
	catchUp   int64
	err       error // the last failure since the last acknowledgement
	// pending: the snapshot waits for the tables' rows, which a
	// checkpoint's load brings (Server.rowsLoaded); meanwhile the primary
	// goes on alone and queues nothing.
	pending bool
	// snapEnd is the snapshot's last operation (its tables' rows follow
	// it): the snapshot is acknowledged once it is.
	snapEnd int64
	// fills are the snapshot's rows operations not written yet: the link
	// writes each from the tables' frozen slots as it sends it
	// (tablerepl.go), outside the locks.
	fills map[*pb.ReplicaOp]chunkFill
	// progress is when the standby last acknowledged an operation: the
	// lag's age counts from it or from the oldest operation queued,
	// whichever is later (a standby working through a long snapshot is
	// not stuck).
	progress time.Time
}

// replicaWait is what a request waits for: its operation's sequence
// number on a link (nil: nothing to wait for).
type replicaWait struct {
	r   *replicator
	seq int64
}

// startReplica attaches the standby at addr: its first operation is a
// snapshot of the whole state. Until the standby acknowledges it the
// primary goes on alone. Call with mu held, after stopReplica.
func (s *Server) startReplica(addr string) error {
	if s.dial == nil {
		return status.Error(codes.FailedPrecondition, "ps: this process cannot reach a standby (no replica dialer)")
	}
	// A link numbers its operations from 1, or, after another link of
	// the same epoch (the chief's Init sent again), from past the last
	// number that one used: a late batch of the old link then holds only
	// numbers the standby skips as applied (installSnapshot).
	first := int64(1)
	if s.linkEpoch == s.epoch {
		first = s.linkSeq + 1
	}
	r := &replicator{addr: addr, epoch: s.epoch, stop: make(chan struct{}), wake: make(chan struct{}, 1), first: first,
		nextSeq: first, acked: first - 1, progress: s.now()}
	if s.tables.loadingRows() {
		r.pending = true
	} else {
		s.queueSnapshot(r)
	}
	s.rep = r
	go s.runReplica(r)
	go s.refreshLag(r)
	s.log.Info("attaching a hot standby", "addr", addr, "epoch", s.epoch, "version", s.shard.Version())
	return nil
}

// queueSnapshot queues the shard's snapshot (snapshotOps) on r, whose
// queue is empty. Call with mu held.
func (s *Server) queueSnapshot(r *replicator) {
	for _, op := range s.snapshotOps(r) {
		r.queue, r.queued, r.release = append(r.queue, op), append(r.queued, s.now()), append(r.release, nil)
		r.nextSeq++
	}
	r.snapEnd = r.nextSeq - 1
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// stopReplica drops the standby link, if any: the primary goes on alone,
// and requests waiting for the standby are answered. Call with mu held.
func (s *Server) stopReplica() {
	if s.rep == nil {
		return
	}
	close(s.rep.stop)
	s.linkEpoch, s.linkSeq = s.rep.epoch, s.rep.nextSeq-1
	s.rep = nil
	s.tables.setReplicating(false)
	s.updateLag()
	s.notify()
}

// replicate queues op for the standby, if the primary has one, with
// the function that releases the buffer it holds (nil: none). Call with
// mu held, right after applying op.
func (s *Server) replicate(op *pb.ReplicaOp, release func()) replicaWait {
	r := s.rep
	if r == nil || r.pending {
		if release != nil {
			release()
		}
		return replicaWait{}
	}
	seq := r.nextSeq
	r.nextSeq++
	r.queue = append(r.queue, op)
	r.queued = append(r.queued, s.now())
	r.release = append(r.release, release)
	select {
	case r.wake <- struct{}{}:
	default:
	}
	s.updateLag()
	return replicaWait{r: r, seq: seq}
}

// lastQueued is what waits for the standby to hold every update queued
// so far (nothing: no standby, or none queued). Call with mu held.
func (s *Server) lastQueued() replicaWait {
	r := s.rep
	if r == nil || r.pending || r.nextSeq == r.first {
		return replicaWait{}
	}
	return replicaWait{r: r, seq: r.nextSeq - 1}
}

// replicated says every update applied is on the standby (or there is no
// standby to wait for: none, or its snapshot still travels): what a pull
// may see. Call with mu held.
func (s *Server) replicated() bool {
	r := s.rep
	return r == nil || r.pending || !r.snapAcked || r.acked == r.nextSeq-1
}

// attached says the standby holds every update the primary answered:
// the chief may promote it. Call with mu held.
func (r *replicator) attached() bool { return r.snapAcked && r.acked >= r.catchUp }

// visibleVersion is the version workers can see: the standby's while it
// lags. Call with mu held.
func (s *Server) visibleVersion() int64 {
	if !s.replicated() {
		return s.rep.ackedVersion
	}
	return s.shard.Version()
}

// awaitReplica waits until w's operation is safe to acknowledge: the
// standby holds it, the link was dropped or replaced (the primary goes on
// alone, or a new standby starts from a snapshot that holds it), or the
// standby never attached. A primary deposed meanwhile refuses it as
// Unavailable: the worker sends it to the new primary.
func (s *Server) awaitReplica(ctx context.Context, w replicaWait) error {
	if w.r == nil {
		return nil
	}
	timer := time.NewTimer(replicaAckTimeout)
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case s.role != rolePrimary:
			return status.Errorf(codes.Unavailable, "ps: shard %d: not acknowledged (this primary was deposed before its standby held the update)", s.index)
		case s.rep != w.r || !w.r.snapAcked || w.r.acked >= w.seq:
			return nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			return status.FromContextError(ctx.Err()).Err()
		case <-timer.C:
			s.mu.Lock()
			return status.Errorf(codes.Unavailable, "ps: shard %d: the standby at %s did not acknowledge the update within %v", s.index, w.r.addr, replicaAckTimeout)
		}
		s.mu.Lock()
	}
}

// runReplica is the link's goroutine: it connects to the standby and sends
// it the queued operations in order until the link is stopped. A failed
// batch is sent again (the standby skips what it already applied); a
// batch refused because a newer epoch exists deposes the primary.
func (s *Server) runReplica(r *replicator) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-r.stop
		cancel()
	}()
	var client ReplicaClient
	closeConn := func() error { return nil }
	defer func() {
		closeConn()
		// The link is stopped (nothing is queued on it any more) and no
		// batch is being sent: the buffers still queued are free.
		s.mu.Lock()
		r.releaseFirst(len(r.release))
		s.mu.Unlock()
	}()
	backoff := replicaRetryFirst
	retry := func(err error) bool {
		s.mu.Lock()
		if s.rep == r && r.err == nil {
			s.log.Warn("hot standby not reachable; retrying", "addr", r.addr, "err", err)
		}
		if s.rep == r {
			r.err = err
		}
		s.mu.Unlock()
		select {
		case <-r.stop:
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, replicaRetryMax)
		return true
	}
	for client == nil {
		c, cl, err := s.dial(ctx, r.addr)
		if err == nil {
			client, closeConn = c, cl
		} else if !retry(err) {
			return
		}
	}
	for {
		batch, ok := s.nextBatch(r)
		if !ok {
			return
		}
		cctx, ccancel := context.WithTimeout(ctx, replicaCallTimeout)
		ack, err := client.Replicate(cctx, batch)
		ccancel()
		if err == nil {
			if err = s.acknowledged(r, batch, ack); err == nil {
				backoff = replicaRetryFirst
				continue
			}
		}
		if status.Code(err) == codes.Aborted {
			s.depose(r, err)
			return
		}
		if !retry(err) {
			return
		}
	}
}

// nextBatch waits for queued operations and returns the next batch: the
// oldest unacknowledged operations, as many as fit in two pushes' bytes
// or minBatchBytes, whichever is more (the pushes of a step arrive
// together; a PS's gRPC limit holds two with room to spare:
// task.psMaxRecv), a snapshot alone. ok is false
// once the link is stopped. The batch's snapshot rows not written yet
// are written after the lock is released.
func (s *Server) nextBatch(r *replicator) (*pb.ReplicaBatch, bool) {
	batch, fills, ok := s.takeBatch(r)
	for _, f := range fills {
		f.write()
	}
	return batch, ok
}

// takeBatch is nextBatch's work under the lock; fills are the batch's
// rows operations still to be written.
func (s *Server) takeBatch(r *replicator) (*pb.ReplicaBatch, []chunkFill, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(r.queue) == 0 {
		s.mu.Unlock()
		select {
		case <-r.stop:
			s.mu.Lock()
			return nil, nil, false
		case <-r.wake:
		}
		s.mu.Lock()
	}
	if s.rep != r {
		return nil, nil, false
	}
	limit := max(2*4*len(s.shard.Params()), minBatchBytes)
	n, size := 0, 0
	var fills []chunkFill
	for _, op := range r.queue {
		b := opBytes(op)
		f, unwritten := r.fills[op]
		if unwritten {
			b = f.bytes
		}
		if n > 0 && (size+b > limit || op.GetSnapshot() != nil) {
			break
		}
		n, size = n+1, size+b
		if unwritten {
			fills = append(fills, f)
			delete(r.fills, op)
		}
		if op.GetSnapshot() != nil {
			break
		}
	}
	return &pb.ReplicaBatch{RunId: s.runID, Shard: int32(s.index), Epoch: r.epoch, FirstSeq: r.acked + 1,
		Ops: slices.Clone(r.queue[:n])}, fills, true
}

// minBatchBytes is the least a batch may hold (a snapshot's rows and a
// CTR shard's row requests come in many operations, and its dense part
// is small); a PS's message limit keeps 1 MiB of room over its model's
// copies (task.psMaxRecv).
const minBatchBytes = 512 << 10

func opBytes(op *pb.ReplicaOp) int {
	switch {
	case op.GetPush() != nil:
		return len(op.GetPush().Grad)
	case op.GetPushRows() != nil:
		return blocksBytes(op.GetPushRows().Tables)
	case op.GetPullRows() != nil:
		return blocksBytes(op.GetPullRows().Tables)
	case op.GetRows() != nil:
		c := op.GetRows()
		return 8*(len(c.Keys)+len(c.LastSeen)) + len(c.Values) + len(c.State)
	case op.GetSnapshot() != nil:
		i := op.GetSnapshot().Init
		return len(i.GetParams()) + len(i.GetOptimizerState()) + proto.Size(op.GetSnapshot().GetShardState())
	}
	return 64
}

// acknowledged records the standby's acknowledgement of batch; an
// acknowledgement of another operation than the batch's last is an error
// (the batch is sent again, after a pause), but one past the link's
// snapshot before it is acknowledged: the link is numbered past it and
// the snapshot is the next batch.
func (s *Server) acknowledged(r *replicator, batch *pb.ReplicaBatch, ack *pb.ReplicaAck) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rep != r {
		return nil
	}
	last := batch.FirstSeq + int64(len(batch.Ops)) - 1
	if ack.Seq > last && !r.snapAcked && batch.FirstSeq == r.first {
		// The standby holds later operations of this epoch than the
		// link's snapshot (the primary's process restarted and was given
		// the same Init): it skipped the snapshot as an older link's.
		// Number the link past them and send the snapshot again; nothing
		// waits on its numbers before the snapshot is acknowledged.
		d := ack.Seq + 1 - r.first
		r.first, r.nextSeq, r.acked, r.snapEnd = r.first+d, r.nextSeq+d, r.acked+d, r.snapEnd+d
		s.log.Info("the hot standby holds later operations of this epoch: numbering the link past them",
			"addr", r.addr, "epoch", r.epoch, "from", r.first)
		return nil // (the next batch is the snapshot, numbered anew)
	}
	if ack.Seq != last {
		// The standby holds another history: the link is broken until the
		// chief attaches it again.
		return fmt.Errorf("the standby acknowledged operation %d of a batch ending at %d", ack.Seq, last)
	}
	wasAttached := r.attached()
	done := int(last - r.acked)
	for _, op := range r.queue[:done] {
		s.m.ReplicatedBytes.Add(float64(opBytes(op)))
	}
	r.releaseFirst(done)
	r.queue, r.queued = slices.Delete(r.queue, 0, done), slices.Delete(r.queued, 0, done)
	if !r.snapAcked && last >= r.snapEnd {
		r.snapAcked, r.catchUp = true, r.nextSeq-1
		s.log.Info("hot standby holds the snapshot; catching up", "addr", r.addr, "epoch", r.epoch,
			"version", ack.Version, "updates_behind", r.catchUp-last)
	}
	if r.err != nil {
		s.log.Info("hot standby reachable again", "addr", r.addr)
	}
	r.acked, r.ackedVersion, r.err, r.progress = last, ack.Version, nil, s.now()
	if !wasAttached && r.attached() {
		s.log.Info("hot standby attached", "addr", r.addr, "epoch", r.epoch, "version", ack.Version)
	}
	s.updateLag()
	s.notify()
	return nil
}

// releaseFirst gives back the buffers of the first n queued operations
// and drops their release functions. Call with mu held (or once the
// link's goroutine is the only one left that uses r), and only when no
// batch being sent holds them.
func (r *replicator) releaseFirst(n int) {
	for _, f := range r.release[:n] {
		if f != nil {
			f()
		}
	}
	r.release = slices.Delete(r.release, 0, n)
}

// depose: a newer epoch refused the link's batch; a standby was promoted
// in this primary's place (it was frozen or cut off). It serves nobody
// from now on and acknowledges nothing more.
func (s *Server) depose(r *replicator, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rep != r {
		return
	}
	s.log.Warn("deposed: a newer primary serves this shard", "epoch", s.epoch, "err", status.Convert(err).Message())
	s.stopReplica()
	s.setRole(roleDeposed)
}

// refreshLag sets the lag gauges every lagRefresh while r is the link,
// until it is stopped.
func (s *Server) refreshLag(r *replicator) {
	tick := time.NewTicker(lagRefresh)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
			s.mu.Lock()
			if s.rep == r {
				s.updateLag()
			}
			s.mu.Unlock()
		}
	}
}

// updateLag sets the lag metrics. Call with mu held.
func (s *Server) updateLag() {
	n, age := 0, 0.0
	if r := s.rep; r != nil {
		n, age = len(r.queued), s.lagSeconds(r)
	}
	s.m.ReplicationLag.Set(float64(n))
	s.m.ReplicationLagSeconds.Set(age)
}

// lagSeconds is how long the standby has left an update unacknowledged:
// since the oldest one queued, or since its last acknowledgement if that
// is later (0: none waits). Call with mu held.
func (s *Server) lagSeconds(r *replicator) float64 {
	if len(r.queued) == 0 {
		return 0
	}
	from := r.queued[0]
	if r.progress.After(from) {
		from = r.progress
	}
	return s.now().Sub(from).Seconds()
}

// replicaStatus fills resp's replication fields. Call with mu held.
func (s *Server) replicaStatus(resp *pb.StatusResponse) {
	resp.Role, resp.Epoch = s.role, s.epoch
	if r := s.rep; r != nil {
		resp.StandbyAddr, resp.StandbyAttached = r.addr, r.attached()
		resp.ReplicationLagUpdates = int64(len(r.queued))
		resp.ReplicationLagSeconds = s.lagSeconds(r)
	}
}

// snapshotOps is the shard's whole state as replica operations: a
// snapshot, and the rows of its embedding tables after it (tablerepl.go).
// From then on the shard's row requests are replicated too. Call with mu
// held.
func (s *Server) snapshotOps(r *replicator) []*pb.ReplicaOp {
	snap := s.snapshotOp()
	tables, rows, fills := s.tables.tablesSnapshot()
	snap.GetSnapshot().Tables = tables
	r.fills = fills
	return append([]*pb.ReplicaOp{snap}, rows...)
}

// snapshotOp is the shard's dense state as a replica operation. Call
// with mu held.
func (s *Server) snapshotOp() *pb.ReplicaOp {
	st := s.shard.State().Proto()
	init := proto.Clone(s.lastInit).(*pb.InitRequest)
	snapshotInit(init)
	opt, steps := s.shard.Optimizer().State()
	init.Params = slices.Clone(wire.Bytes(s.shard.Params()))
	init.OptimizerState, init.OptimizerStep = slices.Clone(wire.Bytes(opt)), steps
	init.Version, init.MaxVersion, init.Generation, init.Epoch = s.shard.Version(), s.shard.MaxVersion(), s.gen, s.epoch
	return &pb.ReplicaOp{Op: &pb.ReplicaOp_Snapshot{Snapshot: &pb.ReplicaSnapshot{Init: init, ShardState: st}}}
}

// blocksBytes is what row blocks' keys and values take.
func blocksBytes(blocks []*pb.RowBlock) int {
	n := 0
	for _, b := range blocks {
		n += keyBytes(b) + len(b.Values)
	}
	return n
}

// initTemplate is req without its payloads and per-worker lists: what a
// snapshot's Init repeats of it.
func initTemplate(req *pb.InitRequest) *pb.InitRequest {
	t := proto.Clone(req).(*pb.InitRequest) // (an Init is rare: copying its payload once is nothing)
	t.Params, t.OptimizerState, t.DataPositions, t.LiveWorkers, t.StandbyAddr = nil, nil, nil, nil, ""
	return t
}

// clonePush copies a push for the standby's queue: the data plane reuses
// the payload's buffer once the push is answered.
func clonePush(req *pb.PushRequest) *pb.PushRequest {
	return &pb.PushRequest{Worker: req.Worker, Version: req.Version, Grad: slices.Clone(req.Grad), RunId: req.RunId,
		Loss: req.Loss, Generation: req.Generation, DataPosition: req.DataPosition}
}

// Replicate applies a primary's batch of operations (standby side).
func (s *Server) Replicate(ctx context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	defer s.observe("replicate", s.now())
	if err := s.checkBatch(b); err != nil {
		return nil, err
	}
	var fresh *built
	if snap := b.Ops[0].GetSnapshot(); snap != nil {
		x, err := s.fromSnapshot(b, snap)
		if err != nil {
			return nil, err
		}
		fresh = &x
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// Its primary gave up on this call and sends the batch again: a
		// copy arriving late must not be applied over newer state.
		return nil, status.FromContextError(err).Err()
	}
	if b.Epoch < s.epoch || b.Epoch == s.epoch && s.role == rolePrimary {
		return nil, status.Errorf(codes.Aborted, "replica batch of epoch %d refused: this process is the %s of epoch %d", b.Epoch, s.role, s.epoch)
	}
	ops := s.installSnapshot(b, fresh)
	if s.role != roleStandby || s.shard == nil || b.Epoch != s.epoch || b.RunId != s.runID {
		return nil, status.Errorf(codes.Unavailable, "replica batch of epoch %d: this process holds no snapshot of it (role %q, epoch %d)", b.Epoch, s.role, s.epoch)
	}
	if err := s.applyOps(b.FirstSeq+int64(len(b.Ops)-len(ops)), ops); err != nil {
		return nil, err
	}
	return &pb.ReplicaAck{Seq: s.replSeq, Version: s.shard.Version()}, nil
}

// checkBatch refuses a batch with no operations or numbered from before
// 1, or one for another shard than this process serves.
func (s *Server) checkBatch(b *pb.ReplicaBatch) error {
	if len(b.Ops) == 0 || b.FirstSeq < 1 {
		return status.Errorf(codes.InvalidArgument, "replica batch: %d operations from %d", len(b.Ops), b.FirstSeq)
	}
	if s.shardIndex >= 0 && int(b.Shard) != s.shardIndex {
		return status.Errorf(codes.InvalidArgument, "replica batch for shard %d: this process serves shard %d", b.Shard, s.shardIndex)
	}
	return nil
}

// installSnapshot makes fresh, the shard of b's opening snapshot (nil:
// b has none), this standby's state, and returns the operations of b
// still to apply. A snapshot opens a link (it travels alone, first), a
// link sends a batch only once the one before is acknowledged, and a
// new link of an epoch numbers past the old one's operations
// (startReplica). So a snapshot numbered at or past what the standby
// holds of its epoch is installed: the link's own sent again (its
// acknowledgement was lost: nothing came after it, installing it again
// changes nothing), or a new link's (the chief's Init sent again after
// the shard applied it), whose state the standby must take. One
// numbered below is not installed: an older link's, late, or the first
// link of a primary whose process restarted and got the same Init (it
// numbers from 1): the standby acknowledges what it holds, and such a
// primary numbers its link past that and sends the snapshot again
// (acknowledged). Call with mu held.
func (s *Server) installSnapshot(b *pb.ReplicaBatch, fresh *built) []*pb.ReplicaOp {
	switch {
	case fresh == nil:
		return b.Ops
	case b.Epoch == s.epoch && s.role == roleStandby && b.FirstSeq < s.replSeq:
		return b.Ops[1:]
	}
	s.stopReplica()
	s.setRole(roleStandby) // (first: workers' row requests are refused from here)
	s.install(*fresh, false)
	s.tables.awaitChunks(b.Ops[0].GetSnapshot().GetTables(), s.shard)
	s.epoch, s.replSeq = b.Epoch, b.FirstSeq
	s.log.Info("standby: snapshot installed", "shard", b.Shard, "epoch", b.Epoch, "version", s.shard.Version())
	return b.Ops[1:]
}

// applyOps applies ops, numbered from first, in order: one applied
// already (sent again) is skipped, and a gap is refused. Call with mu
// held.
func (s *Server) applyOps(first int64, ops []*pb.ReplicaOp) error {
	for i, op := range ops {
		seq := first + int64(i)
		if seq <= s.replSeq {
			continue // sent again: applied already
		}
		if seq != s.replSeq+1 {
			return status.Errorf(codes.FailedPrecondition, "replica batch: operation %d after %d", seq, s.replSeq)
		}
		if err := s.applyReplicated(op); err != nil {
			return err
		}
		s.replSeq = seq
	}
	return nil
}

// fromSnapshot builds the shard a snapshot describes.
func (s *Server) fromSnapshot(b *pb.ReplicaBatch, snap *pb.ReplicaSnapshot) (built, error) {
	if snap.Init == nil {
		return built{}, status.Errorf(codes.InvalidArgument, "replica batch: a snapshot without an init (operation %d)", b.FirstSeq)
	}
	if snap.Init.RunId != b.RunId || snap.Init.Shard != b.Shard {
		return built{}, status.Errorf(codes.InvalidArgument, "replica snapshot of run %q shard %d in a batch of run %q shard %d", snap.Init.RunId, snap.Init.Shard, b.RunId, b.Shard)
	}
	x, err := s.build(snap.Init)
	if err == nil {
		x.ts, err = buildTables(context.Background(), snap.Init, x.opts.Mode)
	}
	if err == nil {
		err = restoreTablesState(x.ts, snap.Tables)
	}
	if err != nil {
		return built{}, err
	}
	if err := x.sh.SetState(shardStateFromProto(snap.ShardState)); err != nil {
		return built{}, status.Error(codes.InvalidArgument, err.Error())
	}
	return x, nil
}

// applyReplicated applies one of the primary's operations. Call with mu
// held.
func (s *Server) applyReplicated(op *pb.ReplicaOp) error {
	switch {
	case op.GetPush() != nil:
		s.applyPush(op.GetPush(), nil) // the same outcome as on the primary, errors included
	case op.GetMembership() != nil:
		if _, err := s.applyMembership(op.GetMembership()); err != nil {
			return status.Errorf(codes.FailedPrecondition, "replicated membership change: %v (the primary applied it)", err)
		}
	case op.GetStop() != nil:
		s.applyStop()
	case op.GetPullRows() != nil, op.GetPushRows() != nil, op.GetRows() != nil:
		return s.applyTableOp(op)
	case isRetain(op) && op.GetRetain() == dropRetainedOp:
		s.dropRetained()
	case isRetain(op):
		// Ops arrive in the order the primary applied them, so this is
		// the version the primary retained; were it not, the shard's
		// Checkpoint with retained set says so rather than saving
		// another state.
		if v := s.shard.Version(); v != op.GetRetain() {
			s.log.Warn("replicated retain of another version: not kept", "retain", op.GetRetain(), "version", v)
			return nil
		}
		s.retain(s.current())
	default:
		return status.Error(codes.InvalidArgument, "replica batch: an empty operation, or a snapshot after the first")
	}
	return nil
}

func isRetain(op *pb.ReplicaOp) bool {
	_, ok := op.Op.(*pb.ReplicaOp_Retain)
	return ok
}

// orderedAs refuses the chief's order op unless this process holds a
// shard in role, of the run and shard the order is for. Call with mu held.
func (s *Server) orderedAs(op, role, runID string, shard int32) error {
	switch {
	case s.role != role || s.shard == nil:
		return status.Errorf(codes.FailedPrecondition, "%s: this process is not a %s holding the shard's state (role %q)", op, role, s.role)
	case runID != s.runID || int(shard) != s.index:
		return status.Errorf(codes.FailedPrecondition, "%s: for run %q shard %d, this %s holds run %q shard %d", op, runID, shard, role, s.runID, s.index)
	}
	return nil
}

// Promote makes a standby its shard's primary at a newer epoch (chief
// only): it serves workers at once, from the state its old primary
// acknowledged, and refuses that primary's batches from now on.
func (s *Server) Promote(ctx context.Context, req *pb.PromoteRequest) (*pb.PromoteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.orderedAs("promote", roleStandby, req.RunId, req.Shard); err != nil {
		return nil, err
	}
	if req.Epoch <= s.epoch {
		return nil, status.Errorf(codes.FailedPrecondition, "promote: epoch %d is not past this standby's %d", req.Epoch, s.epoch)
	}
	if n := s.tables.snapshotRowsLeft(); n > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "promote: %d operations of the snapshot's table rows have not reached this standby", n)
	}
	s.setRole(rolePrimary)
	s.epoch = req.Epoch
	s.advanced()
	s.log.Warn("promoted to primary", "shard", s.index, "epoch", s.epoch, "version", s.shard.Version())
	return &pb.PromoteResponse{Version: s.shard.Version()}, nil
}

// SetStandby attaches a primary's standby at addr, or drops it ("": the
// primary goes on alone), at the epoch given (chief only).
func (s *Server) SetStandby(ctx context.Context, req *pb.SetStandbyRequest) (*pb.SetStandbyResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.orderedAs("set standby", rolePrimary, req.RunId, req.Shard); err != nil {
		return nil, err
	}
	if req.Epoch < s.epoch {
		return nil, status.Errorf(codes.FailedPrecondition, "set standby: epoch %d is older than this primary's %d", req.Epoch, s.epoch)
	}
	s.stopReplica()
	s.epoch = req.Epoch
	if req.Addr == "" {
		s.log.Warn("hot standby dropped: going on alone", "epoch", s.epoch)
		return &pb.SetStandbyResponse{}, nil
	}
	if err := s.startReplica(req.Addr); err != nil {
		return nil, err
	}
	return &pb.SetStandbyResponse{}, nil
}
