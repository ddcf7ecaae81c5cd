package chief

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// ScaleRequest is the file `pstrain scale` writes for a running
// `pstrain run` (docs/elastic.md): the launcher starts or stops worker
// processes from it and the chief (--scale-file) changes the run's
// worker count. Seq makes a repeated request of the same count a new one.
type ScaleRequest struct {
	Workers int `json:"workers"`
	// PS is the parameter server count asked for (0: unchanged;
	// docs/elastic.md, "Parameter servers").
	PS int `json:"ps,omitempty"`
	// Rebalance asks the launcher to measure the parameter servers' load
	// and, if it is uneven, to rebalance (docs/elastic.md,
	// "Rebalancing"): the launcher then writes the request again with
	// PSWeights, the weights of the new layout, and Imbalance, the
	// measured imbalance; the chief acts on those.
	Rebalance bool    `json:"rebalance,omitempty"`
	PSWeights []int   `json:"ps_weights,omitempty"`
	Imbalance float64 `json:"imbalance,omitempty"`
	Seq       int64   `json:"seq"`
}

// ReadScaleRequest reads a request file.
func ReadScaleRequest(path string) (ScaleRequest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ScaleRequest{}, err
	}
	var r ScaleRequest
	if err := json.Unmarshal(b, &r); err != nil {
		return ScaleRequest{}, fmt.Errorf("scale request %s: %w", path, err)
	}
	return r, nil
}

// scaleWatch notices a new scale request: a file whose modification
// time or sequence changed since it was last read, and that was written
// after since (a request left by an earlier run is not this one's).
type scaleWatch struct {
	since time.Time
	mod   time.Time
	seq   int64
}

// poll returns a new request in path (ok), logging a file it cannot
// read.
func (w *scaleWatch) poll(path string, log *slog.Logger) (ScaleRequest, bool) {
	if path == "" {
		return ScaleRequest{}, false
	}
	fi, err := os.Stat(path)
	if err != nil || fi.ModTime().Equal(w.mod) || fi.ModTime().Before(w.since) {
		return ScaleRequest{}, false
	}
	r, err := ReadScaleRequest(path)
	if err != nil {
		log.Error("could not read the scale request", "err", err)
		w.mod = fi.ModTime()
		return ScaleRequest{}, false
	}
	w.mod = fi.ModTime()
	if r.Seq == w.seq && r.Seq != 0 {
		return ScaleRequest{}, false
	}
	w.seq = r.Seq
	return r, true
}
