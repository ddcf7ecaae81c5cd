package bench

import (
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas/gonum"

	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
)

var mnistMLP = model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}

func TestProductsMLP784x800x10(t *testing.T) {
	got, err := Products(mnistMLP, 128)
	if err != nil {
		t.Fatal(err)
	}
	want := []Gemm{
		{M: 128, N: 800, K: 784},               // X·W1
		{M: 128, N: 10, K: 800},                // H·W2
		{M: 800, N: 10, K: 128, TransA: true},  // dW2 = Hᵀ·dZ2
		{M: 128, N: 800, K: 10, TransB: true},  // dH = dZ2·W2ᵀ
		{M: 784, N: 800, K: 128, TransA: true}, // dW1 = Xᵀ·dZ1
	}
	if len(got) != len(want) {
		t.Fatalf("got %d products %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		g := got[i]
		if g.M != want[i].M || g.N != want[i].N || g.K != want[i].K || g.TransA != want[i].TransA || g.TransB != want[i].TransB {
			t.Errorf("product %d = %+v, want %+v", i, g, want[i])
		}
	}
	flops, err := StepFLOPs(mnistMLP, 128)
	if err != nil {
		t.Fatal(err)
	}
	// Two products of 784x800 (X·W1, dW1) and three of 800x10 (H·W2, dW2, dH).
	if want := int64(2 * 128 * (2*784*800 + 3*800*10)); flops != want {
		t.Fatalf("StepFLOPs = %d, want %d", flops, want)
	}
	if flops/128 != 2556800 {
		t.Fatalf("FLOP per sample = %d, want 2556800", flops/128)
	}
}

func TestProductsDeepNet(t *testing.T) {
	spec := model.Spec{Input: 24, Hidden: []int{16, 12}, Classes: 5}
	got, err := Products(spec, 8)
	if err != nil {
		t.Fatal(err)
	}
	// 3 forward, 3 weight gradients, 2 hidden-activation gradients.
	if len(got) != 8 {
		t.Fatalf("got %d products, want 8: %+v", len(got), got)
	}
	flops, _ := StepFLOPs(spec, 8)
	want := int64(2 * 8 * (2*(24*16+16*12+12*5) + 16*12 + 12*5))
	if flops != want {
		t.Fatalf("StepFLOPs = %d, want %d", flops, want)
	}
	// Logistic regression: no hidden layer, so no activation gradient.
	lr, _ := Products(model.Spec{Input: 4, Classes: 3}, 2)
	if len(lr) != 2 {
		t.Fatalf("logistic regression has %d products, want 2", len(lr))
	}
}

func TestProductsRejectsBadInput(t *testing.T) {
	if _, err := Products(mnistMLP, 0); err == nil {
		t.Error("batch 0 accepted")
	}
	if _, err := StepFLOPs(model.Spec{Input: 784, Hidden: []int{0}, Classes: 10}, 128); err == nil {
		t.Error("hidden layer of size 0 accepted")
	}
}

// TestGemmBuffersLayout checks that the ceiling's Sgemm calls describe the
// products Products lists (shapes, transposition and leading dimensions),
// against a naive triple loop.
func TestGemmBuffersLayout(t *testing.T) {
	prods := []Gemm{
		{M: 3, N: 4, K: 5},
		{M: 3, N: 4, K: 5, TransA: true},
		{M: 3, N: 4, K: 5, TransB: true},
	}
	g := newGemmBuffers(prods, rand.New(rand.NewPCG(1, 2)))
	g.run(gonum.Implementation{})
	for i, p := range prods {
		a, b := g.a[i], g.b[i]
		at := func(r, k int) float32 {
			if p.TransA {
				return a[k*p.M+r]
			}
			return a[r*p.K+k]
		}
		bt := func(k, c int) float32 {
			if p.TransB {
				return b[c*p.K+k]
			}
			return b[k*p.N+c]
		}
		for r := 0; r < p.M; r++ {
			for c := 0; c < p.N; c++ {
				var want float32
				for k := 0; k < p.K; k++ {
					want += at(r, k) * bt(k, c)
				}
				if d := g.c[i][r*p.N+c] - want; d > 1e-5 || d < -1e-5 {
					t.Fatalf("product %d (%+v) C[%d,%d] = %v, want %v", i, p, r, c, g.c[i][r*p.N+c], want)
				}
			}
		}
	}
	var _ Sgemmer = gonum.Implementation{}
}

// The default CNN's products are the ones nn's cnnNet calls, with the
// same shapes: the conv blocks' im2col products around the dense layers.
func TestProductsCNN(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 32}, Hidden: []int{256}, Classes: 10}
	got, err := Products(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []Gemm{
		{M: 2 * 576, N: 16, K: 25, TransB: true}, // conv0 forward
		{M: 2 * 64, N: 32, K: 400, TransB: true}, // conv1 forward
		{M: 2, N: 256, K: 512},                   // dense0
		{M: 2, N: 10, K: 256},                    // dense1
		{M: 256, N: 10, K: 2, TransA: true},      // dW dense1
		{M: 2, N: 256, K: 10, TransB: true},      // dH dense1
		{M: 512, N: 256, K: 2, TransA: true},     // dW dense0
		{M: 2, N: 512, K: 256, TransB: true},     // dH dense0: into the pooled map
		{M: 32, N: 400, K: 2 * 64, TransA: true}, // dW conv1
		{M: 2 * 64, N: 400, K: 32},               // dCol conv1
		{M: 16, N: 25, K: 2 * 576, TransA: true}, // dW conv0 (no dCol: the images)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d products %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		g := got[i]
		if g.M != want[i].M || g.N != want[i].N || g.K != want[i].K || g.TransA != want[i].TransA || g.TransB != want[i].TransB {
			t.Errorf("product %d (%s) = %+v, want %+v", i, g.Name, g, want[i])
		}
	}
	flops, _ := StepFLOPs(spec, 1)
	// Per sample: conv0 2 x 576·16·25, conv1 3 x 64·32·400, dense0
	// 3 x 512·256, dense1 3 x 256·10, two FLOPs per term.
	if want := int64(2 * (2*576*16*25 + 3*64*32*400 + 3*512*256 + 3*256*10)); flops != want {
		t.Fatalf("StepFLOPs = %d per sample, want %d", flops, want)
	}
}

// A batch of more than nn.ConvChunk images: each conv product is made
// once per chunk (a last chunk of fewer is a product of its own), the
// dense ones once, and the FLOPs are the batch's.
func TestProductsCNNChunks(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 32}, Hidden: []int{256}, Classes: 10}
	const batch = 2*nn.ConvChunk + 4
	got, err := Products(spec, batch)
	if err != nil {
		t.Fatal(err)
	}
	want := []Gemm{
		{M: nn.ConvChunk * 576, N: 16, K: 25, TransB: true, Times: 2}, // conv0 forward
		{M: 4 * 576, N: 16, K: 25, TransB: true, Times: 1},
		{M: nn.ConvChunk * 64, N: 32, K: 400, TransB: true, Times: 2}, // conv1 forward
		{M: 4 * 64, N: 32, K: 400, TransB: true, Times: 1},
		{M: batch, N: 256, K: 512},
		{M: batch, N: 10, K: 256},
		{M: 256, N: 10, K: batch, TransA: true},
		{M: batch, N: 256, K: 10, TransB: true},
		{M: 512, N: 256, K: batch, TransA: true},
		{M: batch, N: 512, K: 256, TransB: true},
		{M: 32, N: 400, K: nn.ConvChunk * 64, TransA: true, Times: 2}, // dW conv1
		{M: nn.ConvChunk * 64, N: 400, K: 32, Times: 2},               // dCol conv1
		{M: 32, N: 400, K: 4 * 64, TransA: true, Times: 1},
		{M: 4 * 64, N: 400, K: 32, Times: 1},
		{M: 16, N: 25, K: nn.ConvChunk * 576, TransA: true, Times: 2}, // dW conv0
		{M: 16, N: 25, K: 4 * 576, TransA: true, Times: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d products %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		g := got[i]
		g.Name = ""
		if g != want[i] {
			t.Errorf("product %d (%s) = %+v, want %+v", i, got[i].Name, g, want[i])
		}
	}
	if n := Calls(got); n != 6+5*3 {
		t.Errorf("Calls = %d, want 21 (6 dense, 5 conv products for each of 3 chunks)", n)
	}
	one, _ := StepFLOPs(spec, 1)
	if all, _ := StepFLOPs(spec, batch); all != batch*one {
		t.Errorf("StepFLOPs = %d at %d images, want %d x %d", all, batch, batch, one)
	}
}
