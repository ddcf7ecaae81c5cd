//go:build linux

package dataplane

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/pstrain/pstrain/ml/vec"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// squaresBackend is an echoBackend that takes pushes as a SquaresKeeper
// too, recording the sum of squares each came with (-1: none).
type squaresBackend struct {
	echoBackend
	mu   sync.Mutex
	sums []float64
}

func (b *squaresBackend) PushKept(ctx context.Context, r *pb.PushRequest, release func()) (*pb.PushResponse, error) {
	return b.PushKeptSquares(ctx, r, release, -1)
}

func (b *squaresBackend) PushKeptSquares(ctx context.Context, r *pb.PushRequest, release func(), sq float64) (*pb.PushResponse, error) {
	defer release()
	b.mu.Lock()
	b.sums = append(b.sums, sq)
	b.mu.Unlock()
	return b.Push(ctx, r)
}

// A gradient pushed through the shared region reaches a SquaresKeeper
// with its sum of squares, bit for bit vec.SumSquares of the bytes it
// gets; one pushed on the socket, without (the backend sums it itself).
func TestPushFromTheRegionComesWithItsSumOfSquares(t *testing.T) {
	const n = 100_003 // blocks, chunks and a tail
	r := rand.New(rand.NewPCG(41, 43))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(r.NormFloat64())
	}
	for _, off := range []bool{false, true} {
		b := &squaresBackend{echoBackend: echoBackend{params: make([]byte, 4*n)}}
		_, addr := serveShm(t, b, Config{NoSharedMemory: off}, nil)
		c := client(addr, 8<<20)
		if _, err := c.Push(context.Background(), &pb.PushRequest{Worker: 0, Grad: wire.Bytes(g)}); err != nil {
			t.Fatal(err)
		}
		c.Close()
		b.mu.Lock()
		sums := b.sums
		b.mu.Unlock()
		b.echoBackend.mu.Lock()
		got, err := wire.Floats(append([]byte(nil), b.params...))
		b.echoBackend.mu.Unlock()
		if err != nil || len(sums) != 1 {
			t.Fatalf("shared memory off %v: pushes %v, %v", off, sums, err)
		}
		want := vec.SumSquares(got)
		switch {
		case off && sums[0] != -1:
			t.Errorf("a push on the socket came with a sum of squares %v", sums[0])
		case !off && math.Float64bits(sums[0]) != math.Float64bits(want):
			t.Errorf("a push through the region came with sum of squares %v, its bytes give %v", sums[0], want)
		}
	}
}
