package model

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
)

func TestVariablesAndParams(t *testing.T) {
	s := Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	vs := s.Variables()
	if len(vs) != 4 {
		t.Fatalf("got %d variables, want 4", len(vs))
	}
	if got, want := s.NumParams(), 784*800+800+800*10+10; got != want {
		t.Fatalf("NumParams = %d, want %d", got, want)
	}
	if s.String() != "784-800-10" {
		t.Fatalf("String = %q", s.String())
	}
}

func TestInitDeterministicGlorot(t *testing.T) {
	s := Spec{Input: 50, Hidden: []int{30, 20}, Classes: 10}
	a, b := s.Init(7), s.Init(7)
	c := s.Init(8)
	same, differ := true, false
	for i := range a {
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				same = false
			}
			if a[i][j] != c[i][j] {
				differ = true
			}
		}
	}
	if !same || !differ {
		t.Fatalf("init must be deterministic in the seed (same=%v, differ=%v)", same, differ)
	}
	for i, v := range s.Variables() {
		limit := float32(math.Sqrt(6.0 / float64(v.Rows+v.Cols)))
		for _, x := range a[i] {
			if v.Bias && x != 0 {
				t.Fatalf("%s: bias not zero", v.Name)
			}
			if x < -limit || x > limit {
				t.Fatalf("%s: %v outside ±%v", v.Name, x, limit)
			}
		}
	}
}

func TestParseHiddenAndValidate(t *testing.T) {
	h, err := ParseHidden("256, 128")
	if err != nil || len(h) != 2 || h[0] != 256 || h[1] != 128 {
		t.Fatalf("ParseHidden = %v, %v", h, err)
	}
	for _, bad := range []string{"0", "12,x", "-3"} {
		if _, err := ParseHidden(bad); err == nil {
			t.Errorf("ParseHidden(%q) accepted", bad)
		}
	}
	if err := (Spec{Input: 784, Hidden: []int{0}, Classes: 10}).Validate(); err == nil {
		t.Error("hidden size 0 accepted")
	}
}

// The default CNN's variables: kernels one row per output channel, the
// first dense layer fed by the 4x4x32 map that two valid 5x5 convolutions
// and two poolings leave of a 28x28 image.
func TestCNNVariablesAndShapes(t *testing.T) {
	s := Spec{Kind: KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 32}, Hidden: []int{256}, Classes: 10}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	cl := s.ConvLayers()
	if len(cl) != 2 || cl[0].OutH != 24 || cl[0].PoolH != 12 || cl[1].InC != 16 || cl[1].OutW != 8 || cl[1].PoolW != 4 {
		t.Fatalf("conv geometry %+v", cl)
	}
	if got := s.Features(); got != 4*4*32 {
		t.Fatalf("Features = %d, want 512", got)
	}
	want := []Variable{
		{Name: "conv0/w", Rows: 16, Cols: 25, Conv: true},
		{Name: "conv0/b", Rows: 1, Cols: 16, Bias: true},
		{Name: "conv1/w", Rows: 32, Cols: 16 * 25, Conv: true},
		{Name: "conv1/b", Rows: 1, Cols: 32, Bias: true},
		{Name: "dense0/w", Rows: 512, Cols: 256},
		{Name: "dense0/b", Rows: 1, Cols: 256, Bias: true},
		{Name: "dense1/w", Rows: 256, Cols: 10},
		{Name: "dense1/b", Rows: 1, Cols: 10, Bias: true},
	}
	got := s.Variables()
	if len(got) != len(want) {
		t.Fatalf("got %d variables, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("variable %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if s.NumParams() != 16*25+16+32*400+32+512*256+256+256*10+10 {
		t.Fatalf("NumParams = %d", s.NumParams())
	}
	if s.String() != "cnn 28x28x1-c16-c32-256-10" {
		t.Fatalf("String = %q", s.String())
	}
}

// The kind is in the JSON every task compares at registration, and an MLP's
// JSON is what it was before kinds existed (old checkpoints still match).
func TestSpecJSONCarriesKind(t *testing.T) {
	mlp := Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	if got, want := string(mlp.JSON()), `{"input":784,"hidden":[800],"classes":10}`; got != want {
		t.Fatalf("MLP JSON = %s, want %s", got, want)
	}
	named := mlp
	named.Kind = KindMLP
	if string(named.JSON()) != string(mlp.JSON()) {
		t.Fatalf("kind \"mlp\" changes the JSON: %s", named.JSON())
	}
	cnn := Spec{Kind: KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 32}, Hidden: []int{800}, Classes: 10}
	if string(cnn.JSON()) == string(mlp.JSON()) {
		t.Fatal("a CNN and an MLP with the same sizes have the same JSON")
	}
	var back Spec
	if err := json.Unmarshal(cnn.JSON(), &back); err != nil || !back.IsCNN() || back.String() != cnn.String() {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}

func TestCNNValidate(t *testing.T) {
	ok := Spec{Kind: KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{8}, Classes: 10}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]Spec{
		"unknown kind":      {Kind: "rnn", Input: 784, Classes: 10},
		"no convolutions":   {Kind: KindCNN, Input: 784, Height: 28, Width: 28, Classes: 10},
		"not an image":      {Kind: KindCNN, Input: 785, Height: 28, Width: 28, Conv: []int{8}, Classes: 10},
		"too deep":          {Kind: KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{8, 8, 8}, Classes: 10},
		"zero channels":     {Kind: KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{0}, Classes: 10},
		"MLP with conv":     {Input: 784, Conv: []int{8}, Classes: 10},
		"MLP with an image": {Input: 784, Height: 28, Width: 28, Classes: 10},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseConv("16,x"); err == nil {
		t.Error("ParseConv accepted 16,x")
	}
	if c, err := ParseConv("16, 32"); err != nil || len(c) != 2 || c[1] != 32 {
		t.Errorf("ParseConv = %v, %v", c, err)
	}
	if ImageSide(784) != 28 || ImageSide(785) != 0 {
		t.Error("ImageSide")
	}
}

// Conv kernels use the Glorot bound of a convolution: fan-in Cin*k², fan-out
// Cout*k².
func TestCNNInitBounds(t *testing.T) {
	s := Spec{Kind: KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{4, 6}, Hidden: []int{12}, Classes: 10}
	w := s.Init(1)
	for i, v := range s.Variables() {
		if !v.Conv {
			continue
		}
		limit := math.Sqrt(6.0 / float64(v.Cols+v.Rows*KernelSize*KernelSize))
		hi := 0.0
		for _, x := range w[i] {
			hi = math.Max(hi, math.Abs(float64(x)))
		}
		if hi > limit || hi < limit/2 {
			t.Fatalf("%s: largest |w| %v for bound %v", v.Name, hi, limit)
		}
	}
}

func ctrSpec() Spec {
	return Spec{Kind: KindCTR, Input: 13, Fields: 26, EmbeddingDim: 16, Hidden: []int{256, 128}, Classes: 1}
}

func TestCTRSpec(t *testing.T) {
	s := ctrSpec()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := s.Features(); got != 13+26*16 {
		t.Errorf("Features = %d, want 429", got)
	}
	if got := s.String(); got != "ctr 13+26x16-256-128-1" {
		t.Errorf("String = %q", got)
	}
	var names []string
	for _, v := range s.Variables() {
		names = append(names, fmt.Sprintf("%s[%dx%d]", v.Name, v.Rows, v.Cols))
	}
	want := "[dense0/w[429x256] dense0/b[1x256] dense1/w[256x128] dense1/b[1x128] dense2/w[128x1] dense2/b[1x1]]"
	if fmt.Sprint(names) != want {
		t.Errorf("Variables = %v, want %s", names, want)
	}
	if n := s.NumParams(); n != 429*256+256+256*128+128+128+1 {
		t.Errorf("NumParams = %d", n)
	}
	tables := s.Tables()
	if len(tables) != 26 || tables[0] != (Table{"emb/C1", 16}) || tables[25].Name != "emb/C26" {
		t.Errorf("Tables = %v", tables)
	}
	if (Spec{Input: 784, Classes: 10}).Tables() != nil {
		t.Error("an MLP has tables")
	}
	var back Spec
	if err := json.Unmarshal(s.JSON(), &back); err != nil || !back.Equal(s) {
		t.Errorf("JSON round trip: %+v, %v", back, err)
	}
	other := s
	other.EmbeddingDim = 8
	if other.Equal(s) {
		t.Error("specs of different embedding dimensions are equal")
	}
}

func TestCTRSpecRejects(t *testing.T) {
	for _, mod := range []func(*Spec){
		func(s *Spec) { s.Classes = 2 },
		func(s *Spec) { s.EmbeddingDim = 0 },
		func(s *Spec) { s.Input, s.Fields = 0, 0 },
		func(s *Spec) { s.Hidden = []int{0} },
		func(s *Spec) { s.Conv = []int{4} },
		func(s *Spec) { s.Kind = "" }, // an MLP with fields
	} {
		s := ctrSpec()
		mod(&s)
		if s.Validate() == nil {
			t.Errorf("%+v validated", s)
		}
	}
}
