// Package model describes the networks pstrain trains: a model Spec (the
// kind of network and its layer sizes), the list of variables it implies,
// and their deterministic initialisation. It does no math beyond
// initialisation and has no dependencies, so every role (chief, PS,
// worker) can share it.
//
// Three kinds exist. An MLP is Input -> Hidden... -> Classes. A CNN is
// LeNet-style: for each entry of Conv, a 5x5 valid convolution with that
// many output channels, ReLU and a 2x2 max-pool; then the dense layers
// Hidden... -> Classes as in an MLP, on the flattened feature map. A CTR
// model looks up each of Fields categorical keys in an embedding table
// of EmbeddingDim (Tables), concatenates the rows with the Input dense
// features, and runs the dense layers Hidden... -> 1 (a logit).
package model

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// The model kinds.
const (
	KindMLP = "mlp"
	KindCNN = "cnn"
	KindCTR = "ctr"
)

// The CNN's fixed geometry: square kernels of KernelSize, stride 1, no
// padding ("valid"), then non-overlapping PoolSize x PoolSize max-pooling
// (an odd last row or column is dropped).
const (
	KernelSize = 5
	PoolSize   = 2
)

// Spec is a model: an MLP (Kind "" or "mlp") or a CNN (Kind "cnn"). Both
// end in dense layers Hidden... -> Classes with ReLU between them and
// softmax cross-entropy at the end.
type Spec struct {
	// Kind is KindCNN, or empty for an MLP: the JSON of an MLP is the same
	// as before CNNs existed, so its old checkpoints still match.
	Kind    string `json:"kind,omitempty"`
	Input   int    `json:"input"`
	Hidden  []int  `json:"hidden"`
	Classes int    `json:"classes"`
	// CNN only: the input image is Height x Width x Input/(Height*Width)
	// channels, row-major with the channels innermost (NHWC), and Conv
	// lists the output channels of each convolution.
	Height int   `json:"height,omitempty"`
	Width  int   `json:"width,omitempty"`
	Conv   []int `json:"conv,omitempty"`
	// CTR only: Input is the dense features, Classes 1 (the logit), and
	// each of Fields categorical fields has an embedding table of
	// EmbeddingDim values a row (Tables).
	Fields       int `json:"fields,omitempty"`
	EmbeddingDim int `json:"embedding_dim,omitempty"`
}

// IsCNN says whether s is a convolutional network.
func (s Spec) IsCNN() bool { return s.Kind == KindCNN }

// IsCTR says whether s is a click-through-rate model.
func (s Spec) IsCTR() bool { return s.Kind == KindCTR }

// Table is one embedding table of a CTR model: rows of Dim values,
// created when a key is first seen (package embed), so it has no size.
type Table struct {
	Name string
	Dim  int
}

// TableName is the name of the embedding table of categorical field f
// (from 0): "emb/C1", "emb/C2", ... as Criteo names its fields.
func TableName(f int) string { return "emb/C" + strconv.Itoa(f+1) }

// Tables lists a CTR model's embedding tables, one per field (nil for
// other kinds).
func (s Spec) Tables() []Table {
	if !s.IsCTR() {
		return nil
	}
	t := make([]Table, s.Fields)
	for f := range t {
		t[f] = Table{Name: TableName(f), Dim: s.EmbeddingDim}
	}
	return t
}

// KindName is the kind for people: "mlp" or "cnn".
func (s Spec) KindName() string {
	if s.Kind == "" {
		return KindMLP
	}
	return s.Kind
}

// ConvLayer is the geometry of one convolution block (conv, ReLU, pool).
type ConvLayer struct {
	InH, InW, InC   int // input feature map
	OutH, OutW, Out int // convolution output (before pooling)
	PoolH, PoolW    int // after pooling; channels stay Out
}

// K is the length of one output channel's kernel: InC*KernelSize².
func (c ConvLayer) K() int { return c.InC * KernelSize * KernelSize }

// ConvLayers returns the geometry of each convolution block of a CNN (nil
// for an MLP). It does not validate: call Validate first.
func (s Spec) ConvLayers() []ConvLayer {
	if !s.IsCNN() || s.Height <= 0 || s.Width <= 0 {
		return nil
	}
	h, w, c := s.Height, s.Width, s.Input/(s.Height*s.Width)
	out := make([]ConvLayer, 0, len(s.Conv))
	for _, o := range s.Conv {
		l := ConvLayer{InH: h, InW: w, InC: c, OutH: h - KernelSize + 1, OutW: w - KernelSize + 1, Out: o}
		l.PoolH, l.PoolW = l.OutH/PoolSize, l.OutW/PoolSize
		out = append(out, l)
		h, w, c = l.PoolH, l.PoolW, o
	}
	return out
}

// Features is the width of the first dense layer's input: Input for an
// MLP, the flattened last feature map for a CNN, the dense features and
// every field's embedding row for a CTR model.
func (s Spec) Features() int {
	if s.IsCTR() {
		return s.Input + s.Fields*s.EmbeddingDim
	}
	cl := s.ConvLayers()
	if len(cl) == 0 {
		return s.Input
	}
	l := cl[len(cl)-1]
	return l.PoolH * l.PoolW * l.Out
}

// Validate reports an impossible spec.
func (s Spec) Validate() error {
	if s.Kind != "" && s.Kind != KindMLP && s.Kind != KindCNN && s.Kind != KindCTR {
		return fmt.Errorf("model: kind must be mlp, cnn or ctr, got %q", s.Kind)
	}
	if s.IsCTR() {
		return s.validateCTR()
	}
	if s.Fields != 0 || s.EmbeddingDim != 0 {
		return fmt.Errorf("model: only a CTR model has categorical fields and embeddings")
	}
	if s.Input <= 0 {
		return fmt.Errorf("model: input size must be positive, got %d", s.Input)
	}
	if s.Classes < 2 {
		return fmt.Errorf("model: need at least 2 classes, got %d", s.Classes)
	}
	if err := validHidden(s.Hidden); err != nil {
		return err
	}
	if !s.IsCNN() {
		if len(s.Conv) > 0 || s.Height != 0 || s.Width != 0 {
			return fmt.Errorf("model: an MLP has no convolutions or image shape")
		}
		return nil
	}
	return s.validateCNN()
}

// validHidden says which hidden layer size is not positive.
func validHidden(hidden []int) error {
	for i, h := range hidden {
		if h <= 0 {
			return fmt.Errorf("model: hidden layer %d has size %d; sizes must be positive", i, h)
		}
	}
	return nil
}

func (s Spec) validateCTR() error {
	switch {
	case s.Input < 0 || s.Fields < 0 || s.Input+s.Fields == 0:
		return fmt.Errorf("model: a CTR model needs dense or categorical fields, got %d and %d", s.Input, s.Fields)
	case s.Fields > 0 && s.EmbeddingDim <= 0:
		return fmt.Errorf("model: embedding dimension must be positive, got %d", s.EmbeddingDim)
	case s.Classes != 1:
		return fmt.Errorf("model: a CTR model has one output (a logit), got %d classes", s.Classes)
	case len(s.Conv) > 0 || s.Height != 0 || s.Width != 0:
		return fmt.Errorf("model: a CTR model has no convolutions or image shape")
	}
	return validHidden(s.Hidden)
}

func (s Spec) validateCNN() error {
	if s.Height <= 0 || s.Width <= 0 {
		return fmt.Errorf("model: a CNN reads square images, and %d values per sample are not a square", s.Input)
	}
	if s.Input%(s.Height*s.Width) != 0 {
		return fmt.Errorf("model: a CNN needs an image: input %d is not a multiple of height %d x width %d", s.Input, s.Height, s.Width)
	}
	if len(s.Conv) == 0 {
		return fmt.Errorf("model: a CNN needs at least one convolution (--conv)")
	}
	for i, c := range s.Conv {
		if c <= 0 {
			return fmt.Errorf("model: convolution %d has %d channels; counts must be positive", i, c)
		}
	}
	for i, l := range s.ConvLayers() {
		if l.PoolH < 1 || l.PoolW < 1 {
			return fmt.Errorf("model: convolution %d gets a %dx%d input, too small for a %dx%d kernel and %dx%d pooling; use fewer convolutions",
				i, l.InH, l.InW, KernelSize, KernelSize, PoolSize, PoolSize)
		}
	}
	return nil
}

// ImageSide is the side of a square single-channel image of input
// pixels, or 0 if input is not a perfect square.
func ImageSide(input int) int {
	side := int(math.Round(math.Sqrt(float64(input))))
	if side*side != input {
		return 0
	}
	return side
}

// String renders the spec as layer sizes: "784-800-10" for an MLP,
// "cnn 28x28x1-c16-c32-256-10" for a CNN, "ctr 13+26x16-256-128-1" for a
// CTR model (dense features + fields x embedding dimension).
func (s Spec) String() string {
	var parts []string
	if s.IsCTR() {
		parts = append(parts, fmt.Sprintf("ctr %d+%dx%d", s.Input, s.Fields, s.EmbeddingDim))
	} else if cl := s.ConvLayers(); s.IsCNN() && len(cl) > 0 {
		parts = append(parts, fmt.Sprintf("cnn %dx%dx%d", s.Height, s.Width, cl[0].InC))
		for _, c := range s.Conv {
			parts = append(parts, "c"+strconv.Itoa(c))
		}
	} else {
		if s.IsCNN() {
			parts = append(parts, "cnn "+strconv.Itoa(s.Input))
		} else {
			parts = append(parts, strconv.Itoa(s.Input))
		}
	}
	for _, h := range s.Hidden {
		parts = append(parts, strconv.Itoa(h))
	}
	parts = append(parts, strconv.Itoa(s.Classes))
	return strings.Join(parts, "-")
}

// Equal says whether s and o are the same network: the same fields, an
// MLP's kind written or not, an empty list nil or not.
func (s Spec) Equal(o Spec) bool {
	return s.KindName() == o.KindName() && s.Input == o.Input && s.Classes == o.Classes && s.Height == o.Height &&
		s.Width == o.Width && slices.Equal(s.Hidden, o.Hidden) && slices.Equal(s.Conv, o.Conv) &&
		s.Fields == o.Fields && s.EmbeddingDim == o.EmbeddingDim
}

// JSON returns the canonical JSON encoding, used in checkpoint manifests. An MLP's kind is left out
// (written as "mlp" or not), so MLP specs compare equal to those written
// before CNNs existed.
func (s Spec) JSON() []byte {
	if s.Kind == KindMLP {
		s.Kind = ""
	}
	b, _ := json.Marshal(s) // a struct of ints and strings cannot fail to marshal
	return b
}

// ParseHidden parses a comma list of hidden layer sizes ("800" or
// "256,128"). An empty string means no hidden layer (logistic regression).
func ParseHidden(s string) ([]int, error) { return parseSizes("hidden layer size", s) }

// ParseConv parses a comma list of convolution channel counts ("16,32").
func ParseConv(s string) ([]int, error) { return parseSizes("convolution channel count", s) }

func parseSizes(what, s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%s %q is not a number", what, f)
		}
		if n <= 0 {
			return nil, fmt.Errorf("%s must be positive, got %d", what, n)
		}
		out = append(out, n)
	}
	return out, nil
}

// Variable is one trainable tensor: a weight matrix [Rows x Cols] or a bias
// vector (Rows = 1). A convolution kernel has one row per output channel
// (Cols = input channels x KernelSize², the patch in NHWC order), so
// sharding by rows shards it by output channel.
type Variable struct {
	Name string
	Rows int
	Cols int
	Bias bool
	// Conv marks a convolution kernel: its fan-out is Rows*KernelSize²
	// rather than Cols.
	Conv bool
}

// Size is the number of float32 elements.
func (v Variable) Size() int { return v.Rows * v.Cols }

// glorotLimit is the Glorot-uniform bound sqrt(6/(fanIn+fanOut)).
func (v Variable) glorotLimit() float64 {
	fanIn, fanOut := v.Rows, v.Cols
	if v.Conv {
		fanIn, fanOut = v.Cols, v.Rows*KernelSize*KernelSize
	}
	return math.Sqrt(6.0 / float64(fanIn+fanOut))
}

// Variables lists the spec's variables in a fixed order. An MLP: layer0/w,
// layer0/b, layer1/w, ... A CNN: conv0/w, conv0/b, ..., then dense0/w,
// dense0/b, ... A CTR model: its dense layers dense0/w, dense0/b, ...
// (its embedding tables are not variables: see Tables).
func (s Spec) Variables() []Variable {
	var vs []Variable
	for l, c := range s.ConvLayers() {
		vs = append(vs,
			Variable{Name: fmt.Sprintf("conv%d/w", l), Rows: c.Out, Cols: c.K(), Conv: true},
			Variable{Name: fmt.Sprintf("conv%d/b", l), Rows: 1, Cols: c.Out, Bias: true},
		)
	}
	prefix := "layer"
	if s.IsCNN() || s.IsCTR() {
		prefix = "dense"
	}
	dims := append(append([]int{s.Features()}, s.Hidden...), s.Classes)
	for l := 0; l+1 < len(dims); l++ {
		vs = append(vs,
			Variable{Name: fmt.Sprintf("%s%d/w", prefix, l), Rows: dims[l], Cols: dims[l+1]},
			Variable{Name: fmt.Sprintf("%s%d/b", prefix, l), Rows: 1, Cols: dims[l+1], Bias: true},
		)
	}
	return vs
}

// NumParams is the total number of float32 parameters of the variables
// (a CTR model's embedding rows are not counted: they are created as
// keys are seen).
func (s Spec) NumParams() int {
	n := 0
	for _, v := range s.Variables() {
		n += v.Size()
	}
	return n
}

// Init returns Glorot-uniform weights and zero biases, deterministic in seed.
func (s Spec) Init(seed uint64) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	vs := s.Variables()
	out := make([][]float32, len(vs))
	for i, v := range vs {
		out[i] = make([]float32, v.Size())
		if v.Bias {
			continue
		}
		limit := v.glorotLimit()
		for j := range out[i] {
			out[i][j] = float32((r.Float64()*2 - 1) * limit)
		}
	}
	return out
}
