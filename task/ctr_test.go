package task

import (
	"testing"

	"github.com/pstrain/pstrain/config"
)

// TestRowsTravelOnTheDataPlaneUnlessTheyWouldGoInTheClear: a CTR
// worker's rows take the TCP data plane whenever the run does, plain or
// encrypted, and gRPC's TLS when the data plane would authenticate
// their keys without encrypting them. (A silent fallback to gRPC trains
// the same model, slower: TestCTRRowsOverEveryPlaneTrainTheSameModel
// cannot see it.)
func TestRowsTravelOnTheDataPlaneUnlessTheyWouldGoInTheClear(t *testing.T) {
	for _, c := range []struct {
		plane   config.DataPlane
		privacy config.Privacy
		want    bool
	}{
		{config.TCP, "", true},
		{config.TCP, config.Encrypt, true},
		{config.TCP, config.Integrity, false},
		{config.GRPC, config.Encrypt, false},
		{config.GRPC, config.Integrity, false},
	} {
		r := config.Default()
		r.DataPlane, r.DataPlanePrivacy = c.plane, c.privacy
		if got := rowsOnDataPlane(r); got != c.want {
			t.Errorf("--data-plane %s, privacy %q: rows on the data plane %t, want %t", c.plane, c.privacy, got, c.want)
		}
	}
}
