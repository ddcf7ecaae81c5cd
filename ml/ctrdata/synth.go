package ctrdata

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/pstrain/pstrain/internal/hashmix"
	"github.com/pstrain/pstrain/ml/binmetric"
)

// SynthName is the synthetic data set's name (--dataset synth-ctr) and
// the directory, under the data directory, it is written to.
const SynthName = "synth-ctr"

// The files of a synthetic set, in its directory. MetaFile is written
// last: a directory without it is not a complete set.
const (
	TrainFile = "train.ctr"
	TestFile  = "test.ctr"
	MetaFile  = "meta.json"
	// FormatName is Meta.Format of this package's sets.
	FormatName = "pstrain-ctr-1"
)

// Config is a synthetic set: its size and the planted model's shape.
type Config struct {
	Seed  uint64 `json:"seed"`
	Train int    `json:"train"`
	Test  int    `json:"test"`
	// Zipf is the exponent s of the keys' distribution: a field's key of
	// rank r (from 0) has probability proportional to (r+1)^-s; s > 1.
	Zipf float64 `json:"zipf"`
	// Dense is the number of dense fields; Vocab the number of keys of
	// each categorical field (its length is the categorical fields).
	Dense int   `json:"dense"`
	Vocab []int `json:"vocab"`
	// BaseRate is the fraction of positive labels the bias is set for.
	BaseRate float64 `json:"base_rate"`
	// Signal is the spread of the keys' planted weights: the weight of a
	// field's key of rank r is Signal * (the field's scale, 0.5 to 1.5) *
	// N(0, 1) / (1 + r/Decay). The frequent keys carry the signal and a
	// rare key's weight is small: a model cannot learn a key it has seen
	// twice, and the planted optimum should be reachable.
	Signal float64 `json:"signal"`
	Decay  float64 `json:"decay"`
}

// DefaultVocab is the vocabulary of each of Criteo's 26 categorical
// fields: from 10 to 10^7 keys, log-uniformly spread.
func DefaultVocab() []int {
	v := make([]int, Criteo.Cat)
	for f := range v {
		v[f] = int(math.Round(math.Pow(10, 1+6*float64(f)/float64(Criteo.Cat-1))))
	}
	return v
}

// DefaultConfig is `pstrain data synth-ctr`'s set.
func DefaultConfig() Config {
	return Config{
		Seed: 1, Train: 500_000, Test: 100_000, Zipf: 1.1,
		Dense: Criteo.Dense, Vocab: DefaultVocab(),
		BaseRate: 0.25, Signal: 0.45, Decay: 10,
	}
}

// Schema is the set's fields.
func (c Config) Schema() Schema { return Schema{Dense: c.Dense, Cat: len(c.Vocab)} }

// Validate says what is wrong with a configuration, phrased for a user.
func (c Config) Validate() error {
	switch {
	case c.Train < 1 || c.Test < 2:
		return fmt.Errorf("--train must be at least 1 and --test at least 2, got %d and %d", c.Train, c.Test)
	case !(c.Zipf > 1) || math.IsInf(c.Zipf, 0):
		return fmt.Errorf("--zipf must be a number above 1, got %v", c.Zipf)
	case !(c.BaseRate > 0 && c.BaseRate < 1):
		return fmt.Errorf("base rate must be in (0, 1), got %v", c.BaseRate)
	case !(c.Signal >= 0) || !(c.Decay > 0) || math.IsInf(c.Signal+c.Decay, 0):
		return fmt.Errorf("signal %v and decay %v: want >= 0 and > 0", c.Signal, c.Decay)
	}
	for f, v := range c.Vocab {
		if v < 1 || v > 1<<31 {
			return fmt.Errorf("field %s has %d keys: want 1 to 2^31", FieldName(f), v)
		}
	}
	return c.Schema().Validate()
}

// Meta describes a written set: its configuration, the planted model's
// bias and what the planted model scores on the test set (the best any
// model can expect).
type Meta struct {
	Format        string  `json:"format"`
	Config        Config  `json:"config"`
	Bias          float64 `json:"bias"`
	TrainBaseRate float64 `json:"train_base_rate"`
	TestBaseRate  float64 `json:"test_base_rate"`
	// PlantedAUC is the AUC of the true probabilities on the test set.
	PlantedAUC     float64 `json:"planted_auc"`
	PlantedLogLoss float64 `json:"planted_logloss"`
	PlantedNE      float64 `json:"planted_normalized_entropy"`
}

// fmix32 is MurmurHash3's finaliser: a bijection of 32-bit words.
func fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	return h ^ h>>16
}

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// hashNormal is a standard normal drawn from a hash (Box-Muller).
func hashNormal(h uint64) float64 {
	u1, u2 := unit(hashmix.Mix(h)), unit(hashmix.Mix(h+hashmix.Golden))
	return math.Sqrt(-2*math.Log(1-u1)) * math.Cos(2*math.Pi*u2)
}

// planted is the model labels are drawn from: a key's weight is a pure
// function of the seed, its field and its rank, so vocabularies of 10^7
// need no memory.
type planted struct {
	cfg        Config
	fieldSalt  []uint64  // per categorical field
	fieldScale []float64 // per categorical field
	keySalt    []uint32  // per categorical field: its keys' permutation
	denseMu    []float64 // per dense field: the log-count's mean
	denseCoef  []float64 // per dense field: its weight
	bias       float64
}

func newPlanted(c Config) *planted {
	p := &planted{cfg: c}
	base := hashmix.Mix(c.Seed ^ 0x5ca1ab1e)
	for f := range c.Vocab {
		h := hashmix.Mix(base + hashmix.Golden*uint64(f+1))
		p.fieldSalt = append(p.fieldSalt, h)
		p.fieldScale = append(p.fieldScale, c.Signal*(0.5+unit(hashmix.Mix(h^1))))
		p.keySalt = append(p.keySalt, uint32(hashmix.Mix(h^2)))
	}
	for j := range c.Dense {
		h := hashmix.Mix(base ^ (hashmix.Golden * uint64(j+1000)))
		p.denseMu = append(p.denseMu, 0.5+3*unit(h))
		p.denseCoef = append(p.denseCoef, 0.15*hashNormal(h^3))
	}
	return p
}

// key is the key of field f's rank r: a permutation of the 32-bit words,
// so keys look like Criteo's hashed ids and frequent keys are not small
// numbers.
func (p *planted) key(f int, r uint64) uint64 {
	return uint64(fmix32(uint32(r) ^ p.keySalt[f]))
}

// weight is field f's rank r's planted weight.
func (p *planted) weight(f int, r uint64) float64 {
	return p.fieldScale[f] * hashNormal(p.fieldSalt[f]^hashmix.Mix(r)) / (1 + float64(r)/p.cfg.Decay)
}

// sampler draws samples from the planted model.
type sampler struct {
	p     *planted
	r     *rand.Rand
	zipf  []*rand.Zipf
	dense []float32
	keys  []uint64
}

func (p *planted) sampler(stream uint64) *sampler {
	r := rand.New(rand.NewPCG(p.cfg.Seed, stream))
	s := &sampler{p: p, r: r, dense: make([]float32, p.cfg.Dense), keys: make([]uint64, len(p.cfg.Vocab))}
	for _, v := range p.cfg.Vocab {
		s.zipf = append(s.zipf, rand.NewZipf(r, p.cfg.Zipf, 1, uint64(v-1)))
	}
	return s
}

// draw draws one sample's features into s.dense and s.keys and returns
// its logit without the bias.
func (s *sampler) draw() float64 {
	p := s.p
	var z float64
	for j := range s.dense {
		x := 0.0
		if s.r.Float64() >= 0.15 { // else missing, as Criteo's empty fields: 0
			x = math.Log1p(math.Floor(math.Exp(p.denseMu[j] + 1.2*s.r.NormFloat64())))
		}
		s.dense[j] = float32(x)
		z += p.denseCoef[j] * x
	}
	for f, zf := range s.zipf {
		r := zf.Uint64()
		s.keys[f] = p.key(f, r)
		z += p.weight(f, r)
	}
	return z
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// calibrate sets the bias so the mean probability is the base rate, on a
// sample of its own.
func (p *planted) calibrate() {
	s := p.sampler(3)
	z := make([]float64, 20000)
	for i := range z {
		z[i] = s.draw()
	}
	lo, hi := -30.0, 30.0
	for range 100 {
		mid := (lo + hi) / 2
		var m float64
		for _, v := range z {
			m += sigmoid(mid + v)
		}
		if m/float64(len(z)) < p.cfg.BaseRate {
			lo = mid
		} else {
			hi = mid
		}
	}
	p.bias = (lo + hi) / 2
}

// Generate writes the set of c into dir (train, test and meta files) and
// returns its Meta. The same configuration writes the same bytes.
func Generate(dir string, c Config) (*Meta, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ctrdata: %w", err)
	}
	os.Remove(filepath.Join(dir, MetaFile)) // the set is incomplete until it is back
	p := newPlanted(c)
	p.calibrate()
	m := &Meta{Format: FormatName, Config: c, Bias: p.bias}
	trainY, _, err := p.write(filepath.Join(dir, TrainFile), 1, c.Train)
	if err != nil {
		return nil, err
	}
	testY, testP, err := p.write(filepath.Join(dir, TestFile), 2, c.Test)
	if err != nil {
		return nil, err
	}
	m.TrainBaseRate, m.TestBaseRate = binmetric.BaseRate(trainY), binmetric.BaseRate(testY)
	s, err := binmetric.Score(testP, testY)
	if err != nil {
		return nil, fmt.Errorf("ctrdata: scoring the planted model: %w", err)
	}
	m.PlantedAUC, m.PlantedLogLoss, m.PlantedNE = s.AUC, s.LogLoss, s.NormalizedEntropy
	if err := writeMeta(filepath.Join(dir, MetaFile), m); err != nil {
		return nil, err
	}
	return m, nil
}

// write draws n samples from stream into path and returns their labels
// and true probabilities.
func (p *planted) write(path string, stream uint64, n int) ([]uint8, []float32, error) {
	w, err := Create(path, p.cfg.Schema(), n)
	if err != nil {
		return nil, nil, err
	}
	s := p.sampler(stream)
	labels, probs := make([]uint8, n), make([]float32, n)
	for i := range n {
		pr := sigmoid(p.bias + s.draw())
		if s.r.Float64() < pr {
			labels[i] = 1
		}
		probs[i] = float32(pr)
		if err := w.Write(labels[i], s.dense, s.keys); err != nil {
			w.Close()
			return nil, nil, err
		}
	}
	return labels, probs, w.Close()
}

func writeMeta(path string, m *Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("ctrdata: %w", err)
	}
	if err := os.WriteFile(path+".tmp", append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("ctrdata: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("ctrdata: %w", err)
	}
	return nil
}

// ReadMeta reads a synthetic set's Meta from its directory.
func ReadMeta(dir string) (*Meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, fmt.Errorf("ctrdata: %w (make the set with `pstrain data synth-ctr`)", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("ctrdata: %s: %w", MetaFile, err)
	}
	if m.Format != FormatName {
		return nil, fmt.Errorf("ctrdata: %s: format %q, want %q", MetaFile, m.Format, FormatName)
	}
	return &m, nil
}
