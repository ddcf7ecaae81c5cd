package task

import (
	"context"
	"testing"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
)

// TestLayoutSwitch: a count asked for cancels the training loop under
// way, or the next one at once when asked between two; the same count
// again changes nothing; take forgets it.
func TestLayoutSwitch(t *testing.T) {
	l := &layoutSwitch{ps: 2}
	l.SwitchPS(2)
	if n := l.take(); n != 0 {
		t.Fatalf("the count in effect asked for: take %d, want 0", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.arm(cancel)
	l.SwitchPS(3)
	if ctx.Err() == nil {
		t.Fatal("the loop under way was not stopped")
	}
	if n := l.take(); n != 3 {
		t.Fatalf("take %d, want 3", n)
	}
	l.SwitchPS(3) // the stopped loop's last heartbeat, answered late
	l.switched(3)
	ctx, cancel = context.WithCancel(context.Background())
	l.arm(cancel)
	if ctx.Err() != nil || l.take() != 0 {
		t.Fatal("the count switched to stopped the next loop")
	}
	l.SwitchPS(1) // between two loops
	ctx, cancel = context.WithCancel(context.Background())
	l.arm(cancel)
	if ctx.Err() == nil || l.take() != 1 || l.PS() != 3 {
		t.Fatal("a count asked between two loops did not stop the next one")
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
