package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	special := Tensor{Name: "special <&>", Shape: []int{2, 3}, Data: []float32{
		float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, math.MaxFloat32,
	}}
	cases := []struct {
		name    string
		tensors []Tensor
		meta    map[string]string
	}{
		{"empty", nil, nil},
		{"meta only", nil, map[string]string{"format": "pt"}},
		{"model", detTensors(1, 7, 5), map[string]string{"step": "42", "mode": "sync", "ünï": "cödé"}},
		{"special values", []Tensor{special}, nil},
		{"keys", []Tensor{
			{Name: "emb/C1", Shape: []int{3, 2}, Data: []float32{1, 2, 3, 4, 5, 6}},
			{Name: "emb/C1/keys", Shape: []int{3}, DType: U64, U64: []uint64{0, 1<<63 + 5, math.MaxUint64}},
			{Name: "emb/C2/keys", Shape: []int{0}, DType: U64, U64: []uint64{}},
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeSafetensors(t, tc.tensors, tc.meta)
			hlen := binary.LittleEndian.Uint64(b)
			if (8+hlen)%8 != 0 {
				t.Errorf("data section starts at %d, not 8-byte aligned", 8+hlen)
			}
			// The header must be plain JSON that a generic decoder
			// accepts (what other safetensors readers do).
			var generic map[string]json.RawMessage
			if err := json.Unmarshal(b[8:8+hlen], &generic); err != nil {
				t.Fatalf("header is not JSON: %v", err)
			}
			paths := []bool{false} // portable
			if hostLittleEndian() {
				paths = append(paths, true) // zero-copy
			}
			for _, native := range paths {
				got, meta, err := readSafetensors(bytes.NewReader(b), int64(len(b)), native, nil)
				if err != nil {
					t.Fatalf("native=%v: %v", native, err)
				}
				tensorsEqual(t, got, tc.tensors)
				if len(meta) != len(tc.meta) {
					t.Fatalf("meta %v, want %v", meta, tc.meta)
				}
				for k, v := range tc.meta {
					if meta[k] != v {
						t.Fatalf("meta[%q] = %q, want %q", k, meta[k], v)
					}
				}
			}
		})
	}
}

// The portable (big-endian host) path must produce exactly the bytes of
// the zero-copy path.
func TestSafetensorsPortablePathMatchesNative(t *testing.T) {
	if !hostLittleEndian() {
		t.Skip("zero-copy path is only used on little-endian hosts")
	}
	// Larger than one chunk of the portable path, to cover chunking.
	tensors := detTensors(3, 130, 260)
	keys := make([]uint64, 9000)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	tensors = append(tensors, Tensor{Name: "keys", Shape: []int{len(keys)}, DType: U64, U64: keys})
	header, err := buildHeader(tensors, map[string]string{"a": "b"})
	if err != nil {
		t.Fatal(err)
	}
	var native, portable bytes.Buffer
	if _, err := writeWithHeader(&native, header, tensors, true); err != nil {
		t.Fatal(err)
	}
	if _, err := writeWithHeader(&portable, header, tensors, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(native.Bytes(), portable.Bytes()) {
		t.Fatal("portable encoding differs from the zero-copy one")
	}
	// And the bytes are little-endian float32s.
	data := native.Bytes()[len(header):]
	if got := math.Float32frombits(binary.LittleEndian.Uint32(data)); got != tensors[0].Data[0] {
		t.Fatalf("first element decodes to %v, want %v", got, tensors[0].Data[0])
	}
}

// A file written elsewhere: unpadded header, metadata last, keys in
// another order, tensors stored out of header order.
func TestSafetensorsReadsForeignLayout(t *testing.T) {
	data := make([]byte, 12)
	binary.LittleEndian.PutUint32(data[0:], math.Float32bits(3))   // b
	binary.LittleEndian.PutUint32(data[4:], math.Float32bits(1))   // a[0]
	binary.LittleEndian.PutUint32(data[8:], math.Float32bits(2.5)) // a[1]
	header := `{"a":{"shape":[2],"data_offsets":[4,12],"dtype":"F32"},` +
		`"b":{"dtype":"F32","data_offsets":[0,4],"shape":[]},` +
		`"__metadata__":{"format":"pt"}}`
	got, meta, err := readBytes(rawSafetensors(header, data))
	if err != nil {
		t.Fatal(err)
	}
	tensorsEqual(t, got, []Tensor{
		{Name: "a", Shape: []int{2}, Data: []float32{1, 2.5}},
		{Name: "b", Shape: []int{}, Data: []float32{3}},
	})
	if meta["format"] != "pt" {
		t.Fatalf("meta = %v", meta)
	}
	// null metadata and trailing spaces are accepted too.
	if _, _, err := readBytes(rawSafetensors(`{"__metadata__":null}   `, nil)); err != nil {
		t.Fatal(err)
	}
}

func TestSafetensorsRejectsTruncatedAndExtended(t *testing.T) {
	b := encodeSafetensors(t, detTensors(2, 3, 4), map[string]string{"k": "v"})
	for n := 0; n < len(b); n++ {
		if _, _, err := readBytes(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d of %d bytes: err = %v, want ErrCorrupt", n, len(b), err)
		}
	}
	if _, _, err := readBytes(append(b[:len(b):len(b)], 0, 0, 0, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("extended file: err = %v, want ErrCorrupt", err)
	}
	// A reader claiming a larger size than it can deliver.
	if _, _, err := ReadSafetensors(bytes.NewReader(b), int64(len(b))+4); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("short reader: err = %v, want ErrCorrupt", err)
	}
}

func TestSafetensorsRejectsCorrupt(t *testing.T) {
	f32 := func(vals ...float32) []byte {
		b := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b
	}
	hugeLen := make([]byte, 16)
	binary.LittleEndian.PutUint64(hugeLen, math.MaxUint64)
	pastEnd := make([]byte, 16)
	binary.LittleEndian.PutUint64(pastEnd, 9)

	cases := []struct {
		name string
		file []byte
	}{
		{"header length beyond file", pastEnd},
		{"header length max uint64", hugeLen},
		{"header length zero", rawSafetensors("", nil)},
		{"not an object", rawSafetensors(`[]`, nil)},
		{"leading space", rawSafetensors(` {}`, nil)},
		{"bad json", rawSafetensors(`{"a":`, nil)},
		{"trailing garbage", rawSafetensors(`{} x`, nil)},
		{"two objects", rawSafetensors(`{}{}`, nil)},
		{"duplicate tensor", rawSafetensors(
			`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`,
			f32(1, 2))},
		{"duplicate metadata section", rawSafetensors(`{"__metadata__":{},"__metadata__":{}}`, nil)},
		{"duplicate metadata key", rawSafetensors(`{"__metadata__":{"k":"1","k":"2"}}`, nil)},
		{"metadata not string", rawSafetensors(`{"__metadata__":{"k":1}}`, nil)},
		{"metadata nested", rawSafetensors(`{"__metadata__":{"k":{}}}`, nil)},
		{"duplicate field", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"shape":[1],"data_offsets":[0,4]}}`, f32(1))},
		{"unknown field", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, f32(1))},
		{"missing dtype", rawSafetensors(`{"a":{"shape":[1],"data_offsets":[0,4]}}`, f32(1))},
		{"missing offsets", rawSafetensors(`{"a":{"dtype":"F32","shape":[1]}}`, f32(1))},
		{"unknown dtype", rawSafetensors(`{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}}`, f32(1))},
		{"dtype not string", rawSafetensors(`{"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}}`, f32(1))},
		{"three offsets", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32(1, 2))},
		{"negative dim", rawSafetensors(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f32(1))},
		{"fractional dim", rawSafetensors(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, f32(1))},
		{"huge dims", rawSafetensors(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, f32(1))},
		{"dim overflows int64", rawSafetensors(`{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}}`, f32(1))},
		{"shape mismatch", rawSafetensors(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, f32(1))},
		{"reversed offsets", rawSafetensors(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, f32(1))},
		{"offset past end", rawSafetensors(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32(1))},
		{"gap", rawSafetensors(
			`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`,
			f32(1, 2, 3))},
		{"overlap", rawSafetensors(
			`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`,
			f32(1, 2, 3))},
		{"aliased", rawSafetensors(
			`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`,
			f32(1))},
		{"not starting at zero", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(1, 2))},
		{"uncovered tail", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(1, 2))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := readBytes(tc.file)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v (tensors %v), want ErrCorrupt", err, got)
			}
		})
	}
}

func TestSafetensorsRejectsOtherDtypes(t *testing.T) {
	file := rawSafetensors(`{"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 4))
	_, _, err := readBytes(file)
	if !errors.Is(err, ErrUnsupportedDtype) {
		t.Fatalf("err = %v, want ErrUnsupportedDtype", err)
	}
	if !strings.Contains(err.Error(), "BF16") || !strings.Contains(err.Error(), `"w"`) {
		t.Fatalf("error %q should name the tensor and its dtype", err)
	}
}

func TestWriteSafetensorsValidates(t *testing.T) {
	cases := []struct {
		name    string
		tensors []Tensor
		meta    map[string]string
	}{
		{"duplicate", []Tensor{{Name: "a", Shape: []int{1}, Data: []float32{1}}, {Name: "a", Shape: []int{1}, Data: []float32{1}}}, nil},
		{"reserved", []Tensor{{Name: "__metadata__", Shape: []int{1}, Data: []float32{1}}}, nil},
		{"bad utf8 name", []Tensor{{Name: "a\xff", Shape: []int{1}, Data: []float32{1}}}, nil},
		{"bad utf8 meta", nil, map[string]string{"k": "\xff"}},
		{"shape mismatch", []Tensor{{Name: "a", Shape: []int{2, 2}, Data: []float32{1, 2, 3}}}, nil},
		{"negative dim", []Tensor{{Name: "a", Shape: []int{-1, -1}, Data: []float32{1}}}, nil},
		{"overflow", []Tensor{{Name: "a", Shape: []int{math.MaxInt / 2, 4}, Data: nil}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if _, err := WriteSafetensors(&buf, tc.tensors, tc.meta); err == nil {
				t.Fatal("expected an error")
			}
			if buf.Len() != 0 {
				t.Fatalf("%d bytes written for invalid input", buf.Len())
			}
		})
	}
}

func TestF32Conversions(t *testing.T) {
	src := []float32{1, -2.5, float32(math.Inf(1)), 0}
	buf := make([]byte, 16)
	putF32sLE(buf, src)
	if hostLittleEndian() && !bytes.Equal(buf, f32Bytes(src)) {
		t.Fatal("portable encoding differs from the memory view")
	}
	dst := make([]float32, 4)
	getF32sLE(dst, buf)
	tensorsEqual(t, []Tensor{{Data: dst}}, []Tensor{{Data: src}})
	if f32Bytes(nil) != nil {
		t.Fatal("f32Bytes(nil) should be nil")
	}
}

// The encoding is fixed byte for byte, whatever the host's endianness
// (this test also runs on s390x under qemu).
func TestSafetensorsGoldenBytes(t *testing.T) {
	b := encodeSafetensors(t, []Tensor{
		{Name: "w", Shape: []int{2}, Data: []float32{1, -2}},
		{Name: "s", Shape: []int{}, Data: []float32{0.5}},
	}, map[string]string{"step": "3"})
	header := `{"__metadata__":{"step":"3"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}}`
	for (8+len(header))%8 != 0 {
		header += " "
	}
	want := rawSafetensors(header, []byte{
		0x00, 0x00, 0x80, 0x3f, // 1
		0x00, 0x00, 0x00, 0xc0, // -2
		0x00, 0x00, 0x00, 0x3f, // 0.5
	})
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding\n%q\nwant\n%q", b, want)
	}
}
