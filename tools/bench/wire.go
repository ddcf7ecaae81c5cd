package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// WireConfig says what the wire section measures.
type WireConfig struct {
	Spec   model.Spec
	Budget time.Duration // per measurement and round
	Rounds int           // alternating gRPC/TCP rounds; the best of each counts
	Now    Clock
	// DataPlane is the path measured: config.TCP (the default) or config.GRPC.
	DataPlane config.DataPlane
}

// WireResult is the wire section. One round trip is a Push of the whole
// gradient and a Pull of the whole parameter set against one PS (async,
// plain SGD, so the PS applies each push: UpdateMs says what that costs).
type WireResult struct {
	DataPlane           string  `json:"data_plane"`
	PayloadBytes        int     `json:"payload_bytes"` // each way
	MBPerSecond         float64 `json:"mb_per_second"` // both ways, 1 MB = 1e6 bytes
	RoundTripsPerSecond float64 `json:"round_trips_per_second"`
	MsPerRoundTrip      float64 `json:"ms_per_round_trip"`
	TCPMBPerSecond      float64 `json:"tcp_mb_per_second"`
	TCPMsPerRoundTrip   float64 `json:"tcp_ms_per_round_trip"`
	FractionOfTCP       float64 `json:"fraction_of_tcp"`
	UpdateMs            float64 `json:"update_ms"` // one SGD apply of the whole set, in-process
}

// Wire measures push+pull round trips against one in-process PS over
// loopback TCP gRPC and a raw TCP echo of the same payload, alternating.
func Wire(ctx context.Context, c WireConfig) (*WireResult, error) {
	if err := checkDurations(c.Budget, c.Rounds); err != nil {
		return nil, err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	run := config.Default()
	run.PS, run.Workers, run.Mode, run.Optimizer, run.LR = 1, 1, config.Async, "sgd", 1e-6
	run.Hidden, run.Model, run.Conv = c.Spec.Hidden, config.ModelKind(c.Spec.Kind), c.Spec.Conv
	if c.DataPlane != "" {
		run.DataPlane = c.DataPlane
	}
	cl, err := startTCPCluster(ctx, run, c.Spec, 0)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	client := cl.shards[0].Client
	n := cl.plan.Shards[0].Size
	grad := make([]float32, n)
	for i := range grad {
		grad[i] = float32(i%7) * 1e-3
	}
	payload := 4 * n
	var version int64
	roundTrip := func() error {
		if _, err := client.Push(ctx, &pb.PushRequest{RunId: "bench", Worker: 0, Version: version, Grad: wire.Bytes(grad)}); err != nil {
			return fmt.Errorf("push: %w", err)
		}
		resp, err := client.Pull(ctx, &pb.PullRequest{RunId: "bench", Worker: 0})
		if err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		if len(resp.Params) != payload {
			return fmt.Errorf("pull returned %d bytes, want %d", len(resp.Params), payload)
		}
		version = resp.Version
		return nil
	}
	if err := roundTrip(); err != nil { // warm-up
		return nil, fmt.Errorf("bench: wire: %w", err)
	}
	var grpcRate, tcpRate best
	for range c.Rounds {
		k, d, err := loop(ctx, c.Now, c.Budget, 3, roundTrip)
		if err != nil {
			return nil, fmt.Errorf("bench: wire: %w", err)
		}
		grpcRate.add(rate(float64(k), d))
		bps, err := TCPEcho(ctx, c.Now, payload, c.Budget, 3)
		if err != nil {
			return nil, err
		}
		tcpRate.add(bps)
	}
	upd, err := updateCost(ctx, c.Now, n, c.Budget)
	if err != nil {
		return nil, err
	}
	r := wireFigures(payload, float64(grpcRate), float64(tcpRate), upd)
	r.DataPlane = string(run.DataPlane)
	return r, nil
}

// wireFigures derives the reported figures from gRPC round trips per
// second, TCP echo bytes per second (both ways) and the update cost.
func wireFigures(payload int, roundTripsPerSec, tcpBytesPerSec float64, update time.Duration) *WireResult {
	r := &WireResult{
		PayloadBytes:        payload,
		RoundTripsPerSecond: roundTripsPerSec,
		MBPerSecond:         roundTripsPerSec * float64(2*payload) / 1e6,
		TCPMBPerSecond:      tcpBytesPerSec / 1e6,
		UpdateMs:            update.Seconds() * 1e3,
	}
	if roundTripsPerSec > 0 {
		r.MsPerRoundTrip = 1e3 / roundTripsPerSec
	}
	if tcpBytesPerSec > 0 {
		r.TCPMsPerRoundTrip = 1e3 * float64(2*payload) / tcpBytesPerSec
	}
	r.FractionOfTCP = ratio(r.MBPerSecond, r.TCPMBPerSecond)
	return r
}

// updateCost times one plain SGD apply over n parameters, as the PS does
// for every async push.
func updateCost(ctx context.Context, now Clock, n int, budget time.Duration) (time.Duration, error) {
	opt, err := optim.New(optim.Config{Name: "sgd", LR: 1e-6}, n)
	if err != nil {
		return 0, err
	}
	p, g := make([]float32, n), make([]float32, n)
	k, d, err := loop(ctx, now, budget/4, 3, func() error { opt.Apply(p, g, 1); return nil })
	if err != nil {
		return 0, fmt.Errorf("bench: update cost: %w", err)
	}
	return d / time.Duration(k), nil
}
