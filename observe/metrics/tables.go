package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Embedding-table metrics of a parameter-server shard, by table.
const (
	MetricPSTableRows        = "pstrain_ps_table_rows"
	MetricPSTableBytes       = "pstrain_ps_table_bytes"
	MetricPSTableAdmissions  = "pstrain_ps_table_admissions_total"
	MetricPSTableEvictions   = "pstrain_ps_table_evictions_total"
	MetricPSTableDropped     = "pstrain_ps_table_dropped_gradients_total"
	MetricPSTableRowRequests = "pstrain_ps_table_row_requests_total"
)

// LabelTable is an embedding table's name (emb/FIELD).
const LabelTable = "table"

// Tables holds a shard's embedding-table metrics. Each shard counts its
// own rows; a shard's share of the row requests (hot keys) is its
// pstrain_ps_table_row_requests_total over the sum over the shards.
type Tables struct {
	// Rows is the rows the shard holds (pstrain_ps_table_rows).
	Rows *prometheus.GaugeVec
	// Bytes is what they and their optimizer state take
	// (pstrain_ps_table_bytes).
	Bytes *prometheus.GaugeVec
	// Admissions counts rows created, Evictions rows dropped unseen,
	// Dropped the row gradients of keys without a row (not admitted, or
	// evicted since their pull).
	Admissions *prometheus.CounterVec
	Evictions  *prometheus.CounterVec
	Dropped    *prometheus.CounterVec
	// RowRequests counts the keys requested, by table and op (pull or
	// push): each key of a request is one row served.
	RowRequests *prometheus.CounterVec
}

// NewTables creates the table metrics and registers them on reg (nil:
// unregistered).
func NewTables(reg prometheus.Registerer) *Tables {
	f := promauto.With(reg)
	gauge := func(name, help string) *prometheus.GaugeVec {
		return f.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{LabelTable})
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{LabelTable}, labels...))
	}
	return &Tables{
		Rows:       gauge(MetricPSTableRows, "Rows of each embedding table this parameter-server shard holds."),
		Bytes:      gauge(MetricPSTableBytes, "Bytes of each embedding table's rows and optimizer state on this parameter-server shard."),
		Admissions: counter(MetricPSTableAdmissions, "Rows of each embedding table this shard created (a key's first touch after admission)."),
		Evictions:  counter(MetricPSTableEvictions, "Rows of each embedding table this shard dropped, unseen for longer than the table's eviction age."),
		Dropped:    counter(MetricPSTableDropped, "Row gradients this shard dropped for keys without a row (not admitted yet, or evicted since their pull)."),
		RowRequests: counter(MetricPSTableRowRequests,
			"Keys of each embedding table requested from this shard, by op (pull, push): its share of the sum over the shards is its load.", LabelOp),
	}
}
