package worker

import (
	"context"
	"time"

	pb "github.com/pstrain/pstrain/proto"
)

// Heartbeats keeps the worker live at the chief until ctx ends: a
// heartbeat every quarter of timeout (at least every 50 ms), carrying the
// steps done, each given timeout to answer. A failed heartbeat is logged
// at debug level; the chief declares the worker dead only after timeout
// without one.
func (w *Worker) Heartbeats(ctx context.Context, chief pb.ChiefClient, timeout time.Duration) {
	t := time.NewTicker(max(timeout/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		step, _ := w.Progress()
		hctx, cancel := context.WithTimeout(ctx, timeout)
		_, err := chief.Heartbeat(hctx, &pb.HeartbeatRequest{Worker: int32(w.cfg.Index), RunId: w.cfg.RunID, Step: step})
		cancel()
		if err != nil && ctx.Err() == nil {
			w.cfg.Log.Debug("heartbeat failed", "worker", w.cfg.Index, "err", err)
		}
	}
}
