package task

import (
	"context"
	"testing"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
)

// TestLayoutSwitch: a layout asked for cancels the training loop under
// way, or the next one at once when asked between two; the same layout
// again changes nothing; take forgets it. A rebalance (the same count,
// other weights) is another layout.
func TestLayoutSwitch(t *testing.T) {
	even2, even3 := partition.Even(2), partition.Even(3)
	l := &layoutSwitch{cur: even2}
	l.Switch(partition.LayoutOf(2, []int{5, 5}))
	if to := l.take(); to.PS != 0 {
		t.Fatalf("the layout in effect asked for: take %v, want none", to)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.arm(cancel)
	l.Switch(even3)
	if ctx.Err() == nil {
		t.Fatal("the loop under way was not stopped")
	}
	if to := l.take(); !to.Equal(even3) {
		t.Fatalf("take %v, want 3", to)
	}
	l.Switch(even3) // the stopped loop's last heartbeat, answered late
	l.switched(even3)
	ctx, cancel = context.WithCancel(context.Background())
	l.arm(cancel)
	if ctx.Err() != nil || l.take().PS != 0 {
		t.Fatal("the layout switched to stopped the next loop")
	}
	weighted := partition.LayoutOf(3, []int{200, 400, 400})
	l.Switch(weighted) // between two loops
	ctx, cancel = context.WithCancel(context.Background())
	l.arm(cancel)
	if ctx.Err() == nil || !l.take().Equal(weighted) || !l.Layout().Equal(even3) {
		t.Fatal("a rebalance asked between two loops did not stop the next one")
	}
}

// TestInitialPS: the chief's count first, else --ps of a cluster listing
// --max-ps slots, else the cluster's PS.
func TestInitialPS(t *testing.T) {
	o := Options{Cluster: cluster.Spec{PS: []string{"a", "b", "c"}}, Run: config.Run{PS: 2, MaxPS: 3}}
	for _, c := range []struct {
		reg  *pb.RegisterResponse
		o    Options
		want int
	}{
		{nil, o, 2},
		{&pb.RegisterResponse{NumPs: 3}, o, 3},
		{&pb.RegisterResponse{NumPs: 9}, o, 2}, // more than the cluster lists: ignored
		{nil, Options{Cluster: o.Cluster, Run: config.Run{PS: 3}}, 3},
	} {
		if got := initialPS(c.o, c.reg); got != c.want {
			t.Errorf("initialPS(%+v, %v) = %d, want %d", c.o.Run, c.reg, got, c.want)
		}
	}
}
