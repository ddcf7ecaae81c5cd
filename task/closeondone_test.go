package task

import (
	"context"
	"testing"
	"time"

	"github.com/pstrain/pstrain/ml/dataset"
)

// TestCloseOnDoneWakesAHeldRead: a worker's read waiting at an async
// change's hold ends when the worker's context does (Ctrl-C during a
// change), instead of waiting for a plan no heartbeat will bring.
func TestCloseOnDoneWakesAHeldRead(t *testing.T) {
	const n, batch = 40, 5 // two workers: 4 batches an epoch
	ds := &dataset.Dataset{Images: make([]float32, n), Labels: make([]uint8, n), N: n, Dim: 1, Classes: 1}
	load := func(i, c int) (dataset.Samples, error) { return ds.Shard(i, c), nil }
	p := dataset.NewDataPlan(n, batch, 2)
	b, err := dataset.NewElasticBatches(0, 0, p, load)
	if err != nil {
		t.Fatal(err)
	}
	held := p
	held.Hold = 1
	if err := b.SetPlan(held); err != nil {
		t.Fatal(err)
	}
	x, y := make([]float32, batch), make([]uint8, batch)
	for range 4 { // epoch 0: then the hold at epoch 1
		b.Next(x, y)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := closeOnDone(ctx, b)
	defer stop()
	read := make(chan struct{})
	go func() { b.Next(x, y); close(read) }()
	for deadline := time.Now().Add(10 * time.Second); !b.Waiting(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the read past the hold does not wait")
		}
	}
	cancel()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the held read did not end with the context")
	}
	if !b.Ended() {
		t.Fatal("the batches did not end")
	}
}
