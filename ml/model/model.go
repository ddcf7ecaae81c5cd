// Package model describes the networks pstrain trains: a model Spec (layer
// sizes), the list of variables it implies, and their deterministic
// initialisation. It does no math beyond initialisation and has no
// dependencies, so every role (chief, PS, worker) can share it.
package model

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Spec is a multi-layer perceptron: Input -> Hidden... -> Classes, ReLU
// between layers and softmax cross-entropy at the end.
type Spec struct {
	Input   int   `json:"input"`
	Hidden  []int `json:"hidden"`
	Classes int   `json:"classes"`
}

// Validate reports an impossible spec.
func (s Spec) Validate() error {
	if s.Input <= 0 {
		return fmt.Errorf("model: input size must be positive, got %d", s.Input)
	}
	if s.Classes < 2 {
		return fmt.Errorf("model: need at least 2 classes, got %d", s.Classes)
	}
	for i, h := range s.Hidden {
		if h <= 0 {
			return fmt.Errorf("model: hidden layer %d has size %d; sizes must be positive", i, h)
		}
	}
	return nil
}

// String renders the spec as layer sizes, e.g. "784-800-10".
func (s Spec) String() string {
	parts := []string{strconv.Itoa(s.Input)}
	for _, h := range s.Hidden {
		parts = append(parts, strconv.Itoa(h))
	}
	parts = append(parts, strconv.Itoa(s.Classes))
	return strings.Join(parts, "-")
}

// JSON returns the canonical JSON encoding, used for equality checks on
// registration and in checkpoint manifests.
func (s Spec) JSON() []byte {
	b, _ := json.Marshal(s) // a struct of ints cannot fail to marshal
	return b
}

// ParseHidden parses a comma list of hidden layer sizes ("800" or
// "256,128"). An empty string means no hidden layer (logistic regression).
func ParseHidden(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("hidden layer size %q is not a number", f)
		}
		if n <= 0 {
			return nil, fmt.Errorf("hidden layer size must be positive, got %d", n)
		}
		out = append(out, n)
	}
	return out, nil
}

// Variable is one trainable tensor: a weight matrix [Rows x Cols] or a bias
// vector (Rows = 1).
type Variable struct {
	Name string
	Rows int
	Cols int
	Bias bool
}

// Size is the number of float32 elements.
func (v Variable) Size() int { return v.Rows * v.Cols }

// Variables lists the spec's variables in a fixed order: w0, b0, w1, b1, ...
func (s Spec) Variables() []Variable {
	dims := append(append([]int{s.Input}, s.Hidden...), s.Classes)
	var vs []Variable
	for l := 0; l+1 < len(dims); l++ {
		vs = append(vs,
			Variable{Name: fmt.Sprintf("layer%d/w", l), Rows: dims[l], Cols: dims[l+1]},
			Variable{Name: fmt.Sprintf("layer%d/b", l), Rows: 1, Cols: dims[l+1], Bias: true},
		)
	}
	return vs
}

// NumParams is the total number of float32 parameters.
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
		limit := math.Sqrt(6.0 / float64(v.Rows+v.Cols))
		for j := range out[i] {
			out[i][j] = float32((r.Float64()*2 - 1) * limit)
		}
	}
	return out
}
