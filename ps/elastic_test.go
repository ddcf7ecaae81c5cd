package ps

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
)

// step pushes a gradient of 1 from each worker at the shard's version
// and fails unless the last one advanced it.
func step(t *testing.T, s *Shard, workers ...int) {
	t.Helper()
	v := s.Version()
	var res PushResult
	for _, w := range workers {
		var err error
		if res, err = s.PushAt(w, v, []float32{1}, s.DataPosition(w)+1); err != nil {
			t.Fatal(err)
		}
	}
	if !res.Advanced || s.Version() != v+1 {
		t.Fatalf("workers %v at version %d: not advanced (%+v)", workers, v, res)
	}
}

// TestShardMembershipChange walks a sync shard through 2 -> 3 -> 1
// workers: a hold at a step boundary stops every worker's pull there
// and counts no gradient, the release applies the new members and
// replicas, a joining worker's pull waits until it is a member, and a
// removed one's answers done.
func TestShardMembershipChange(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 1)
	if s.PullReady(2, 0) {
		t.Fatal("worker 2 (not a member yet) may pull")
	}
	step(t, s, 0, 1)
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}, Members: 2, Replicas: 2, HoldAt: 1}); !errors.Is(err, ErrPastHold) {
		t.Fatalf("hold at a version reached: %v, want ErrPastHold", err)
	}
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}, Members: 2, Replicas: 2, HoldAt: 3}); err != nil {
		t.Fatal(err)
	}
	step(t, s, 0, 1)
	if !s.PullReady(0, 2) {
		t.Fatal("held before the hold's version")
	}
	step(t, s, 0, 1)
	if s.PullReady(0, 3) || s.PullReady(1, 0) {
		t.Fatal("a worker's pull is answered at the hold's version")
	}
	if !s.PullReady(-1, 3) {
		t.Fatal("the chief's pull waits at a hold")
	}
	if res, err := s.PushAt(0, 3, []float32{1}, 4); err != nil || res.Outcome != Stale || s.DataPosition(0) != 3 {
		t.Fatalf("a gradient at the hold: %+v %v, position %d", res, err, s.DataPosition(0))
	}
	// Repeating the hold (the chief re-sends its membership) is no error.
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}, Members: 2, Replicas: 2, HoldAt: 3}); err != nil {
		t.Fatal(err)
	}
	// Release: 3 members, the third not live yet.
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}, Members: 3, Replicas: 3, MaxVersion: 10}); err != nil {
		t.Fatal(err)
	}
	if !s.PullReady(0, 3) || !s.PullReady(2, 0) {
		t.Fatal("pulls still wait after the release")
	}
	step(t, s, 0, 1) // the third is not live: two gradients complete the step
	s.SetLive([]int{0, 1, 2})
	if res, _ := s.PushAt(0, 4, []float32{1}, 5); res.Advanced {
		t.Fatal("one gradient of three completed a step")
	}
	s.PushAt(1, 4, []float32{1}, 5)
	step(t, s, 2)
	if s.DataPosition(2) != 1 || s.Slots() != 3 {
		t.Fatalf("worker 2: position %d, slots %d", s.DataPosition(2), s.Slots())
	}
	// Down to one: workers 1 and 2 retired.
	if _, err := s.SetMembership(Membership{Live: []int{0, 1, 2}, Members: 1, Retired: []int{1, 2}, Replicas: 1, MaxVersion: 10}); err != nil {
		t.Fatal(err)
	}
	if !s.PullReady(1, 100) || !s.Retired(2) || s.Retired(0) {
		t.Fatal("a retired worker's pull waits")
	}
	if res, _ := s.PushAt(2, 5, []float32{1}, 2); res.Outcome != Stale {
		t.Fatalf("a retired worker's gradient: %+v", res)
	}
	step(t, s, 0)
	for s.Version() < 10 {
		step(t, s, 0)
	}
	if !s.Done() {
		t.Fatal("not done at the new max version")
	}
}

// TestShardAsyncHold: in async and ssp mode a hold at a version the
// shard has passed is taken (it holds from now on), and the gradients of
// pulls answered before it still count, moving the version and the data
// position: a change of the PS count snapshots the shards once the
// workers' last pushes landed.
func TestShardAsyncHold(t *testing.T) {
	for _, mode := range []config.Mode{config.Async, config.SSP} {
		s := newTestShard(t, ShardConfig{Mode: mode, Workers: 2, Staleness: 4}, 1)
		for w := range 2 {
			if res, err := s.PushAt(w, 0, []float32{1}, 1); err != nil || !res.Advanced {
				t.Fatalf("%s: push of worker %d: %+v %v", mode, w, res, err)
			}
		}
		if _, err := s.SetMembership(Membership{Live: []int{0, 1}, HoldAt: 1}); err != nil {
			t.Fatalf("%s: a hold at a version passed: %v, want it taken", mode, err)
		}
		if s.PullReady(0, 0) || s.PullReady(1, 0) {
			t.Fatalf("%s: a worker's pull is answered during the hold", mode)
		}
		if !s.PullReady(-1, 0) {
			t.Fatalf("%s: the chief's pull waits at a hold", mode)
		}
		res, err := s.PushAt(0, 1, []float32{1}, 2)
		if err != nil || res.Outcome != Applied || !res.Advanced || s.Version() != 3 || s.DataPosition(0) != 2 {
			t.Fatalf("%s: a gradient in flight at the hold: %+v %v, version %d, position %d", mode, res, err, s.Version(), s.DataPosition(0))
		}
		if _, err := s.SetMembership(Membership{Live: []int{0, 1}}); err != nil || !s.PullReady(0, 0) {
			t.Fatalf("%s: the release: %v; pulls still wait", mode, err)
		}
	}
}

// Over the server: a hold at a version reached is FAILED_PRECONDITION
// (what the chief reads as a refusal); a worker that joins waits in its
// pull until it is a member; a retired one's pull answers done; a
// checkpoint records every worker's position, the added ones' too.
func TestServerMembership(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	push(t, srv, 0, 0, 1, n)
	push(t, srv, 1, 0, 1, n)
	_, err := srv.SetMembership(ctx, &pb.MembershipRequest{LiveWorkers: []int32{0, 1}, Members: 2, Replicas: 2, MaxVersion: 100, HoldAt: 1})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("hold at the version reached: %v, want FailedPrecondition", err)
	}
	joined := make(chan *pb.PullResponse, 1)
	go func() {
		resp, err := srv.Pull(ctx, &pb.PullRequest{Worker: 2, RunId: "r"})
		if err != nil {
			t.Error(err)
		}
		joined <- resp
	}()
	select {
	case resp := <-joined:
		t.Fatalf("a worker not yet a member pulled: %+v", resp)
	case <-time.After(50 * time.Millisecond): // (a bound on a wait that must not end)
	}
	resp, err := srv.SetMembership(ctx, &pb.MembershipRequest{LiveWorkers: []int32{0, 1, 2}, Members: 3, Replicas: 3, MaxVersion: 100})
	if err != nil || resp.Version != 1 {
		t.Fatalf("release: %+v, %v", resp, err)
	}
	select {
	case resp := <-joined:
		if resp.Done || resp.Version != 1 {
			t.Fatalf("the joining worker's pull: %+v", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the joining worker's pull still waits after the release")
	}
	for w := range int32(3) {
		push(t, srv, w, 1, 1, n)
	}
	if _, err := srv.SetMembership(ctx, &pb.MembershipRequest{LiveWorkers: []int32{0, 1, 2}, Members: 1, Retired: []int32{1, 2}, Replicas: 1, MaxVersion: 100}); err != nil {
		t.Fatal(err)
	}
	if resp, err := srv.Pull(ctx, &pb.PullRequest{Worker: 2, RunId: "r", MinVersion: 50}); err != nil || !resp.Done || resp.DataPosition != 1 {
		t.Fatalf("a retired worker's pull: %+v, %v; want done at position 1", resp, err)
	}
	ck, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 2, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ck.DataPositions, []int64{2, 2, 1}) {
		t.Fatalf("checkpoint positions %v, want [2 2 1]", ck.DataPositions)
	}
}

// A membership that moves the run's last step moves the end of a cosine
// schedule with it, so every shard (and one restored after the change,
// built with the new end) applies the same learning rate.
func TestMembershipMovesTheScheduleEnd(t *testing.T) {
	sched, err := optim.ParseSchedule("cosine")
	if err != nil {
		t.Fatal(err)
	}
	lr, err := optim.NewLRSchedule(1, sched, 0, 5, 10)
	if err != nil {
		t.Fatal(err)
	}
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2, MaxVersion: 10, LR: lr}, 1)
	if _, err := s.SetMembership(Membership{Live: []int{0}, Members: 1, Replicas: 1, MaxVersion: 20}); err != nil {
		t.Fatal(err)
	}
	restored, err := optim.NewLRSchedule(1, sched, 0, 5, 20)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.cfg.LR.At(8), restored.At(8); got != want {
		t.Fatalf("learning rate at step 8 after the end moved to 20: %v, a shard built with that end says %v", got, want)
	}
}
