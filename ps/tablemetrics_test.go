package ps

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
)

// TestTableMetricsFollowRequestsAndReinstalls: a table's row requests
// count each op's keys apart, its rows' gauge follows the pulls that
// create rows, and tables installed again (a new Init) are exported
// afresh after the old ones' gauges were deleted.
func TestTableMetricsFollowRequestsAndReinstalls(t *testing.T) {
	m := metrics.NewTables(nil)
	h := newTableHost(m)
	install := func() *TableSet {
		set := newTableSets(t, tableCfgs(0, 0), config.Sync, 1)[0]
		h.install(set, "r", 1, false, false, false, 0)
		return set
	}
	set := install()
	h.mu.Lock()
	pull := []RowBlock{{Table: "emb/C1", Keys: []uint64{1, 2, 3}, Values: make([]float32, 12)}}
	if err := set.PullBlocks(0, pull); err != nil {
		t.Fatal(err)
	}
	h.count(false, pull)
	h.count(true, []RowBlock{{Table: "emb/C1", Keys: []uint64{1}, Values: make([]float32, 4)}})
	h.mu.Unlock()
	for _, c := range []struct {
		op   string
		want float64
	}{{"pull", 3}, {"push", 1}} {
		if got := testutil.ToFloat64(m.RowRequests.WithLabelValues("emb/C1", c.op)); got != c.want {
			t.Errorf("row requests of %s: %v, want %v", c.op, got, c.want)
		}
	}
	if got := testutil.ToFloat64(m.Rows.WithLabelValues("emb/C1")); got != 3 {
		t.Errorf("rows after the pull: %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.Admissions.WithLabelValues("emb/C1")); got != 3 {
		t.Errorf("admissions after the pull: %v, want 3", got)
	}
	install()
	if n := testutil.CollectAndCount(m.Rows); n != 2 {
		t.Errorf("after a new install: %d row gauges, want one per table (2)", n)
	}
	if got := testutil.ToFloat64(m.Rows.WithLabelValues("emb/C1")); got != 0 {
		t.Errorf("rows of the new tables: %v, want 0", got)
	}
}
