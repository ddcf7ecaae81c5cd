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
	size           int
	version, reach int64
	pulls          []*pb.PullRequest
}

func (s *stepShard) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	s.pulls = append(s.pulls, in)
	if in.MinVersion > s.version {
		if in.MinVersion > s.reach {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		s.version = in.MinVersion
	}
	return &pb.PullResponse{Version: s.version, Params: wire.Bytes(make([]float32, s.size))}, nil
}

// A sync evaluation that read one shard a step behind the other pulls it
// again at the newer version, retaining that one, so that it scores (and
// a checkpoint of the retained state holds) one version; a shard that
// stays behind leaves the evaluation mixed. An async one takes each
// shard's version as it comes.
func TestSyncEvaluationPullsOneVersion(t *testing.T) {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name         string
		mode         config.Mode
		reach        int64 // how far the shard behind gets
		want         []int64
		wantMixed    bool
		wantRepulled bool
	}{
		{"sync, behind by a step", config.Sync, 8, []int64{8, 8}, false, true},
		{"sync, stalled", config.Sync, 7, []int64{7, 8}, true, true},
		{"async", config.Async, 8, []int64{7, 8}, false, false},
	} {
		behind := &stepShard{size: plan.Shards[0].Size, version: 7, reach: c.reach}
		ahead := &stepShard{size: plan.Shards[1].Size, version: 8, reach: 8}
		ch := &Chief{cfg: Config{Run: config.Run{Mode: c.mode}, PS: []PS{{Client: behind}, {Client: ahead}}}, plan: plan}
		params := make([][]float32, len(plan.Vars))
		for i, v := range plan.Vars {
			params[i] = make([]float32, v.Size())
		}
		versions, err := ch.pullForEval(context.Background(), true, params)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		mixed := c.mode == config.Sync && slices.Min(versions) != slices.Max(versions)
		if !slices.Equal(versions, c.want) || mixed != c.wantMixed {
			t.Errorf("%s: versions %v (mixed %t), want %v (%t)", c.name, versions, mixed, c.want, c.wantMixed)
		}
		if repulled := len(behind.pulls) == 2; repulled != c.wantRepulled || len(ahead.pulls) != 1 {
			t.Errorf("%s: %d pulls of the shard behind, %d of the other", c.name, len(behind.pulls), len(ahead.pulls))
		} else if repulled && (behind.pulls[1].MinVersion != 8 || !behind.pulls[1].Retain) {
			t.Errorf("%s: pulled again with %+v, want min_version 8 and retain", c.name, behind.pulls[1])
		}
	}
}
