package chief

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// stepShard answers the chief's pulls at version, and a pull for a
// newer MinVersion at that version if it is at most reach (as a sync
// shard one step behind completes it), else with the deadline's error
// (a stalled shard). It records the pulls.
type stepShard struct {
	pb.ParameterServerClient
	size                      int
	version, reach, overshoot int64 // overshoot: answer a newer one than asked (a step completed meanwhile)
	pulls                     []*pb.PullRequest
}

func (s *stepShard) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	s.pulls = append(s.pulls, in)
	if in.MinVersion > s.version {
		if in.MinVersion > s.reach {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		s.version = min(in.MinVersion+s.overshoot, s.reach)
	}
	return &pb.PullResponse{Version: s.version, Params: wire.Bytes(make([]float32, s.size))}, nil
}

// A sync evaluation that read one shard a step behind the other pulls it
// again at the newer version, retaining that one, so that it scores (and
// a checkpoint of the retained state holds) one version, and pulls
// again whichever falls behind meanwhile; a shard that stays behind
// leaves the evaluation mixed. The windows are the first pulls'. An
// async evaluation takes each shard's version as it comes.
func TestSyncEvaluationPullsOneVersion(t *testing.T) {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		mode      config.Mode
		reach     int64 // how far the shard behind gets
		overshoot int64
		want      []int64
		wantMixed bool
		wantPulls [2]int // of the shard behind, and of the other
	}{
		{"sync, behind by a step", config.Sync, 8, 0, []int64{8, 8}, false, [2]int{2, 1}},
		{"sync, behind, then a step ahead", config.Sync, 9, 1, []int64{9, 9}, false, [2]int{2, 2}},
		{"sync, stalled", config.Sync, 7, 0, []int64{7, 8}, true, [2]int{2, 1}},
		{"async", config.Async, 8, 0, []int64{7, 8}, false, [2]int{1, 1}},
	} {
		behind := &stepShard{size: plan.Shards[0].Size, version: 7, reach: c.reach, overshoot: c.overshoot}
		ahead := &stepShard{size: plan.Shards[1].Size, version: 8, reach: 9}
		ch := &Chief{cfg: Config{Run: config.Run{Mode: c.mode}, PS: []PS{{Client: behind}, {Client: ahead}}}, plan: plan}
		params := make([][]float32, len(plan.Vars))
		for i, v := range plan.Vars {
			params[i] = make([]float32, v.Size())
		}
		versions, first, err := ch.pullForEval(context.Background(), true, params)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(first, []int64{7, 8}) {
			t.Errorf("%s: first versions %v, want [7 8] (the windows they closed)", c.name, first)
		}
		mixed := c.mode == config.Sync && slices.Min(versions) != slices.Max(versions)
		if !slices.Equal(versions, c.want) || mixed != c.wantMixed {
			t.Errorf("%s: versions %v (mixed %t), want %v (%t)", c.name, versions, mixed, c.want, c.wantMixed)
		}
		if got := [2]int{len(behind.pulls), len(ahead.pulls)}; got != c.wantPulls {
			t.Errorf("%s: %v pulls of the shard behind and of the other, want %v", c.name, got, c.wantPulls)
		} else if got[0] == 2 && (behind.pulls[1].MinVersion != 8 || !behind.pulls[1].Retain) {
			t.Errorf("%s: pulled again with %+v, want min_version 8 and retain", c.name, behind.pulls[1])
		}
	}
}
