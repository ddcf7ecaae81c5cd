package task

import (
	"testing"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
)

// A PS accepts messages as large as an Init of the whole model with its
// optimizer state, plus 1 MiB, and no larger than --max-message-mb.
func TestPSMaxRecvFollowsTheModel(t *testing.T) {
	r := config.Default() // MNIST, 784-800-10, momentum, 2 workers
	const params = 784*800 + 800 + 800*10 + 10
	if got, want := psMaxRecv(r, 256<<20), 2*4*params+16*2+1<<20; got != want {
		t.Errorf("momentum: %d, want %d", got, want)
	}
	r.Optimizer = "adam"
	if got, want := psMaxRecv(r, 256<<20), 3*4*params+16*2+1<<20; got != want {
		t.Errorf("adam: %d, want %d", got, want)
	}
	// A standby receives its primary's snapshot: an Init, and the step
	// under way (its sum, or a copy per worker) as base64 in JSON.
	r.PSReplicas = 1
	if got, want := psMaxRecv(r, 256<<20), (3+2*(1+2))*4*params+16*2+1<<20; got != want {
		t.Errorf("adam with a standby: %d, want %d", got, want)
	}
	if got := psMaxRecv(r, 1<<20); got != 1<<20 {
		t.Errorf("under a smaller --max-message-mb: %d", got)
	}
	r.Dataset = "idx:a,b,c,d"
	if got := psMaxRecv(r, 256<<20); got != 256<<20 {
		t.Errorf("a data set of unknown shape: %d, want --max-message-mb", got)
	}
}

func TestPushSizeFollowsTheWireType(t *testing.T) {
	r := config.Default()
	req := &pb.InitRequest{Params: make([]byte, 4000), ShardOptions: ps.OptionsFor(r).Proto()}
	if got := pushSize(req); got != 4000 {
		t.Errorf("f32: %d, want 4000", got)
	}
	r.WireDType = config.BF16
	req.ShardOptions = ps.OptionsFor(r).Proto()
	if got := pushSize(req); got != 2000 {
		t.Errorf("bf16: %d, want 2000", got)
	}
}
