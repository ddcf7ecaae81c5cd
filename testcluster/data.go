package testcluster

import (
	"math/rand/v2"

	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/worker"
)

// Synthetic is a fixed random classification data set that a small model
// learns quickly: n samples of dim values, the samples of class k noisy
// copies (Gaussian noise, sd 0.3) of a random prototype in [0,1)^dim. It
// is determined by its arguments. Unlike a loaded image set its values
// are not confined to [0,1].
func Synthetic(n, dim, classes int, seed uint64) *dataset.Dataset {
	r := rand.New(rand.NewPCG(seed, 1))
	protos := make([][]float32, classes)
	for k := range protos {
		protos[k] = make([]float32, dim)
		for j := range protos[k] {
			protos[k][j] = float32(r.Float64())
		}
	}
	d := &dataset.Dataset{Images: make([]float32, n*dim), Labels: make([]uint8, n), N: n, Dim: dim, Classes: classes}
	for i := 0; i < n; i++ {
		k := r.IntN(classes)
		d.Labels[i] = uint8(k)
		for j := 0; j < dim; j++ {
			d.Images[i*dim+j] = protos[k][j] + float32(r.NormFloat64()*0.3)
		}
	}
	return d
}

// SyntheticSplit is a training and a test set of the same Synthetic task:
// the first nTrain samples of Synthetic(nTrain+nTest, ...) and the rest.
func SyntheticSplit(nTrain, nTest, dim, classes int, seed uint64) (train, test *dataset.Dataset) {
	all := Synthetic(nTrain+nTest, dim, classes, seed)
	cut := nTrain * dim
	train = &dataset.Dataset{Images: all.Images[:cut:cut], Labels: all.Labels[:nTrain:nTrain], N: nTrain, Dim: dim, Classes: classes}
	test = &dataset.Dataset{Images: all.Images[cut:], Labels: all.Labels[nTrain:], N: nTest, Dim: dim, Classes: classes}
	return train, test
}

// NewBatches is how a worker task reads its data shard (a
// dataset.TrainShard there, any dataset.Samples here): the full batches
// (dataset.FullBatches) of a dataset.Batcher of batch and seed.
func NewBatches(shard dataset.Samples, batch int, seed int64) worker.BatchSource {
	return dataset.NewFullBatches(dataset.NewBatcher(shard, batch, seed))
}
