package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	gblas "gonum.org/v1/gonum/blas"

	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
)

// Sgemmer is the single-precision matrix product of a BLAS (gonum's
// blas.Float32 has it; so does the BLAS gorgonia runs on).
type Sgemmer interface {
	Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
}

// ComputeConfig says what the compute section measures.
type ComputeConfig struct {
	Spec     model.Spec
	Batches  []int   // the first one is the headline figure
	BLAS     Sgemmer // the BLAS nn runs on (gorgonia.WhichBLAS())
	BLASName string
	Budget   time.Duration // per measurement and round
	Rounds   int           // alternating step/ceiling rounds; the best of each counts
	Seed     uint64
	Now      Clock
}

// ComputeBatch is the compute figure at one batch size.
type ComputeBatch struct {
	Batch                   int     `json:"batch"`
	SamplesPerSecond        float64 `json:"samples_per_second"`
	GFLOPS                  float64 `json:"gflops"`
	CeilingSamplesPerSecond float64 `json:"ceiling_samples_per_second"`
	CeilingGFLOPS           float64 `json:"ceiling_gflops"`
	FractionOfCeiling       float64 `json:"fraction_of_ceiling"`
}

// ComputeResult is the compute section. The top-level figures repeat the
// first batch size's.
type ComputeResult struct {
	BLAS              string         `json:"blas"`
	Model             string         `json:"model,omitempty"` // model.Spec.String
	Batch             int            `json:"batch"`
	FLOPsPerSample    int64          `json:"flops_per_sample"`
	Products          int            `json:"products_per_step"`
	SamplesPerSecond  float64        `json:"samples_per_second"`
	GFLOPS            float64        `json:"gflops"`
	CeilingGFLOPS     float64        `json:"ceiling_gflops"`
	FractionOfCeiling float64        `json:"fraction_of_ceiling"`
	Batches           []ComputeBatch `json:"batches"`
}

// Compute measures nn's forward+backward samples/s at each batch size and
// the ceiling: the same BLAS running only the step's matrix products
// (Products) on buffers of the same shapes. Step and ceiling alternate for
// Rounds rounds so that both see the same machine.
func Compute(ctx context.Context, c ComputeConfig) (*ComputeResult, error) {
	if c.BLAS == nil {
		return nil, errors.New("bench: compute needs a BLAS")
	}
	if len(c.Batches) == 0 {
		return nil, errors.New("bench: compute needs at least one batch size")
	}
	if err := checkDurations(c.Budget, c.Rounds); err != nil {
		return nil, err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	res := &ComputeResult{BLAS: c.BLASName, Model: c.Spec.String()}
	for _, b := range c.Batches {
		cb, err := computeBatch(ctx, c, b)
		if err != nil {
			return nil, err
		}
		res.Batches = append(res.Batches, cb)
	}
	first := res.Batches[0]
	flops, _ := StepFLOPs(c.Spec, first.Batch) // validated by computeBatch
	prods, _ := Products(c.Spec, first.Batch)
	res.Batch, res.FLOPsPerSample, res.Products = first.Batch, flops/int64(first.Batch), Calls(prods)
	res.SamplesPerSecond, res.GFLOPS = first.SamplesPerSecond, first.GFLOPS
	res.CeilingGFLOPS, res.FractionOfCeiling = first.CeilingGFLOPS, first.FractionOfCeiling
	return res, nil
}

func computeBatch(ctx context.Context, c ComputeConfig, batch int) (ComputeBatch, error) {
	prods, err := Products(c.Spec, batch)
	if err != nil {
		return ComputeBatch{}, err
	}
	flops, _ := StepFLOPs(c.Spec, batch)
	net, err := nn.New(c.Spec, batch, true)
	if err != nil {
		return ComputeBatch{}, err
	}
	defer net.Close()
	r := rand.New(rand.NewPCG(c.Seed, uint64(batch)))
	for i, w := range c.Spec.Init(c.Seed) {
		copy(net.Params()[i], w)
	}
	for i := range net.Input() {
		net.Input()[i] = r.Float32()
	}
	labels := make([]uint8, batch)
	for i := range labels {
		labels[i] = uint8(r.IntN(c.Spec.Classes))
	}
	net.SetLabels(labels)
	step := func() error { _, err := net.Step(); return err }
	gemms := newGemmBuffers(prods, r)
	ceiling := func() error { gemms.run(c.BLAS); return nil }
	// Warm up both (first-call allocations, page faults).
	if err := step(); err != nil {
		return ComputeBatch{}, err
	}
	gemms.run(c.BLAS)

	var stepRate, ceilRate best
	for range c.Rounds {
		n, d, err := loop(ctx, c.Now, c.Budget, 2, step)
		if err != nil {
			return ComputeBatch{}, fmt.Errorf("bench: compute batch %d: %w", batch, err)
		}
		stepRate.add(rate(float64(n), d))
		n, d, err = loop(ctx, c.Now, c.Budget, 2, ceiling)
		if err != nil {
			return ComputeBatch{}, fmt.Errorf("bench: compute ceiling batch %d: %w", batch, err)
		}
		ceilRate.add(rate(float64(n), d))
	}
	return computeFigures(batch, flops, float64(stepRate), float64(ceilRate)), nil
}

// computeFigures turns steps/s of the net and of the bare products into
// the reported figures.
func computeFigures(batch int, stepFLOPs int64, stepsPerSec, ceilingStepsPerSec float64) ComputeBatch {
	return ComputeBatch{
		Batch:                   batch,
		SamplesPerSecond:        stepsPerSec * float64(batch),
		GFLOPS:                  stepsPerSec * float64(stepFLOPs) / 1e9,
		CeilingSamplesPerSecond: ceilingStepsPerSec * float64(batch),
		CeilingGFLOPS:           ceilingStepsPerSec * float64(stepFLOPs) / 1e9,
		FractionOfCeiling:       ratio(stepsPerSec, ceilingStepsPerSec),
	}
}

// gemmBuffers holds operands for each product, row-major, laid out as the
// transposition flags say.
type gemmBuffers struct {
	prods   []Gemm
	a, b, c [][]float32
}

func newGemmBuffers(prods []Gemm, r *rand.Rand) *gemmBuffers {
	g := &gemmBuffers{prods: prods}
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = r.Float32() - 0.5
		}
		return x
	}
	for _, p := range prods {
		g.a = append(g.a, fill(p.M*p.K))
		g.b = append(g.b, fill(p.K*p.N))
		g.c = append(g.c, make([]float32, p.M*p.N))
	}
	return g
}

func (g *gemmBuffers) run(impl Sgemmer) {
	for i, p := range g.prods {
		tA, lda := gblas.NoTrans, p.K
		if p.TransA {
			tA, lda = gblas.Trans, p.M
		}
		tB, ldb := gblas.NoTrans, p.N
		if p.TransB {
			tB, ldb = gblas.Trans, p.K
		}
		for range p.times() {
			impl.Sgemm(tA, tB, p.M, p.N, p.K, 1, g.a[i], lda, g.b[i], ldb, 0, g.c[i], p.N)
		}
	}
}
