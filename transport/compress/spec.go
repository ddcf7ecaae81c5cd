package compress

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind names a codec as --compress spells it.
type Kind string

// The codecs.
const (
	None Kind = "none" // float32 as it is
	TopK Kind = "topk" // the largest coordinates: indices and values
	Int8 Kind = "int8" // a power-of-two scale per chunk, a byte per value
	Sign Kind = "sign" // a bit per value and a power-of-two scale
)

// Spec is a parsed --compress value: a kind and, for top-k, the fraction
// of coordinates sent.
type Spec struct {
	Kind     Kind
	Fraction float64 // top-k only: in (0, MaxTopK]
}

// MaxTopK is the largest fraction top-k sends: at 8 bytes a coordinate,
// half of them cost as many bytes as float32 does.
const MaxTopK = 0.5

// Parse reads a --compress value: none (or ""), topk:FRACTION with
// FRACTION in (0, MaxTopK], int8 or sign.
func Parse(s string) (Spec, error) {
	switch kind, arg, hasArg := strings.Cut(s, ":"); {
	case s == "" || s == string(None):
		return Spec{Kind: None}, nil
	case (s == string(Int8) || s == string(Sign)) && !hasArg:
		return Spec{Kind: Kind(s)}, nil
	case kind == string(TopK):
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(f > 0 && f <= MaxTopK) {
			return Spec{}, fmt.Errorf("topk needs a fraction of the coordinates in (0, %v], e.g. topk:0.01, got %q", MaxTopK, s)
		}
		return Spec{Kind: TopK, Fraction: f}, nil
	}
	return Spec{}, fmt.Errorf("must be none, topk:FRACTION (e.g. topk:0.01), int8 or sign, got %q", s)
}

// String is the spec as Parse reads it.
func (s Spec) String() string {
	switch s.Kind {
	case TopK:
		return "topk:" + strconv.FormatFloat(s.Fraction, 'g', -1, 64)
	case "":
		return string(None)
	}
	return string(s.Kind)
}

// Codec is the spec's codec.
func (s Spec) Codec() Codec {
	switch s.Kind {
	case TopK:
		return topK{fraction: s.Fraction}
	case Int8:
		return int8Codec{}
	case Sign:
		return signCodec{}
	}
	return noneCodec{}
}

// Setting is a parsed --compress value: the codec of the pushes and
// that of the pulls. One codec names both directions; PUSH/PULL names
// each (e.g. topk:0.01/int8: pushes as top-k, pulls as int8).
type Setting struct {
	Push, Pull Spec
}

// ParseSetting reads a --compress value: a codec as Parse reads it, for
// both directions, or two separated by a slash, pushes first.
func ParseSetting(s string) (Setting, error) {
	push, pull, two := strings.Cut(s, "/")
	if two && (push == "" || pull == "") {
		return Setting{}, fmt.Errorf("PUSH/PULL needs a codec on each side of the slash (e.g. topk:0.01/int8), got %q", s)
	}
	p, err := Parse(push)
	if err != nil {
		return Setting{}, err
	}
	if !two {
		return Setting{Push: p, Pull: p}, nil
	}
	q, err := Parse(pull)
	if err != nil {
		return Setting{}, fmt.Errorf("pulls: %w", err)
	}
	return Setting{Push: p, Pull: q}, nil
}

// Off says whether neither direction is compressed.
func (s Setting) Off() bool { return s.Push.Kind.off() && s.Pull.Kind.off() }

// String is the setting as ParseSetting reads it: one codec when both
// directions share it.
func (s Setting) String() string {
	if s.Push.String() == s.Pull.String() {
		return s.Push.String()
	}
	return s.Push.String() + "/" + s.Pull.String()
}

func (k Kind) off() bool { return k == None || k == "" }
