package model

import (
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
