package dataplane

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// sameBlocks says whether two block lists hold the same tables, keys
// and values (an empty list and a nil one are the same).
func sameBlocks(a, b []*pb.RowBlock) bool {
	return slices.EqualFunc(a, b, func(x, y *pb.RowBlock) bool {
		return x.Table == y.Table && slices.Equal(x.Keys, y.Keys) && bytes.Equal(x.Values, y.Values) &&
			slices.Equal(x.SmallKeys, y.SmallKeys)
	})
}

func codecSamples() [][]*pb.RowBlock {
	return [][]*pb.RowBlock{
		nil,
		{{Table: "emb/C1", SmallKeys: []uint64{1, 300, 1 << 40}}},
		{{Table: "emb/C1", Keys: []uint64{1 << 63, 7}, Values: wire.Bytes([]float32{1, -2, 3.5, 0})},
			{Table: "emb/C2", SmallKeys: []uint64{0}, Values: wire.Bytes([]float32{9})}, {}},
		{{Values: wire.Bytes([]float32{1, 2, 3})}},
	}
}

// TestRowBlocksAsProtoWritesThem: the codec writes what proto.Marshal
// writes and reads back what it wrote, for requests and answers.
func TestRowBlocksAsProtoWritesThem(t *testing.T) {
	var d rowBlocks
	for i, blocks := range codecSamples() {
		for _, c := range []struct {
			num protowire.Number
			msg proto.Message
		}{{fieldRequestTables, &pb.PushRowsRequest{Tables: blocks}}, {fieldResponseTables, &pb.PullRowsResponse{Tables: blocks}}} {
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.msg)
			if err != nil {
				t.Fatal(err)
			}
			got := appendBlocks([]byte{0xff}, c.num, blocks)[1:]
			if !bytes.Equal(got, want) {
				t.Errorf("sample %d, field %d: wrote %x, proto writes %x", i, c.num, got, want)
			}
			if n := blocksSize(c.num, blocks); n != len(got) {
				t.Errorf("sample %d: blocksSize %d, wrote %d bytes", i, n, len(got))
			}
			back, err := d.decode(got, c.num)
			if err != nil || !sameBlocks(back, blocks) {
				t.Errorf("sample %d, field %d: read back %v (%v), want %v", i, c.num, back, err, blocks)
			}
		}
	}
}

// TestRowBlocksReadUnpackedAndSplitFields: what proto.Unmarshal accepts
// beyond proto.Marshal's own output — keys one by one, a repeated field
// in pieces with the other between them, unknown fields, a repeated
// table name (the last counts) — reads the same.
func TestRowBlocksReadUnpackedAndSplitFields(t *testing.T) {
	var blk []byte
	blk = protowire.AppendTag(blk, fieldBlockTable, protowire.BytesType)
	blk = protowire.AppendString(blk, "old")
	blk = protowire.AppendTag(blk, fieldBlockKeys, protowire.Fixed64Type)
	blk = protowire.AppendFixed64(blk, 5)
	blk = protowire.AppendTag(blk, fieldBlockSmallKeys, protowire.VarintType)
	blk = protowire.AppendVarint(blk, 70)
	blk = protowire.AppendTag(blk, 9, protowire.VarintType) // unknown
	blk = protowire.AppendVarint(blk, 1)
	blk = protowire.AppendTag(blk, fieldBlockKeys, protowire.BytesType)
	blk = protowire.AppendBytes(blk, protowire.AppendFixed64(protowire.AppendFixed64(nil, 6), 1<<60))
	blk = protowire.AppendTag(blk, fieldBlockSmallKeys, protowire.BytesType)
	blk = protowire.AppendBytes(blk, protowire.AppendVarint(nil, 71))
	blk = protowire.AppendTag(blk, fieldBlockTable, protowire.BytesType)
	blk = protowire.AppendString(blk, "emb/C3")
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType) // run_id, not read
	b = protowire.AppendString(b, "run")
	b = protowire.AppendTag(b, fieldRequestTables, protowire.BytesType)
	b = protowire.AppendBytes(b, blk)

	var want pb.PullRowsRequest
	if err := proto.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if w := want.Tables[0]; w.Table != "emb/C3" || !slices.Equal(w.Keys, []uint64{5, 6, 1 << 60}) || !slices.Equal(w.SmallKeys, []uint64{70, 71}) {
		t.Fatalf("the test's payload is not what it means to be: proto reads %v", w)
	}
	var d rowBlocks
	got, err := d.decode(b, fieldRequestTables)
	if err != nil || !sameBlocks(got, want.Tables) {
		t.Fatalf("read %v (%v), proto reads %v", got, err, want.Tables)
	}
}

// TestRowBlocksRefuseWhatProtoRefuses: truncated payloads, a table name
// that is not UTF-8 and packed fixed64 keys of a length not a multiple
// of 8 are errors, as they are for proto.Unmarshal.
func TestRowBlocksRefuseWhatProtoRefuses(t *testing.T) {
	good := appendBlocks(nil, fieldRequestTables, codecSamples()[2])
	badName := appendBlocks(nil, fieldRequestTables, []*pb.RowBlock{{Table: "x"}})
	badName[len(badName)-1] = 0xff
	var oddKeys []byte
	oddKeys = protowire.AppendTag(oddKeys, fieldBlockKeys, protowire.BytesType)
	oddKeys = protowire.AppendBytes(oddKeys, make([]byte, 12))
	oddKeys = protowire.AppendBytes(protowire.AppendTag(nil, fieldRequestTables, protowire.BytesType), oddKeys)
	var d rowBlocks
	for name, b := range map[string][]byte{"truncated": good[:len(good)-3], "name": badName, "keys": oddKeys} {
		if proto.Unmarshal(b, &pb.PushRowsRequest{}) == nil {
			t.Fatalf("%s: proto reads it: the case tests nothing", name)
		}
		if got, err := d.decode(b, fieldRequestTables); err == nil {
			t.Errorf("%s: read %v, want an error", name, got)
		}
	}
}

// TestRowBlocksValuesAligned: the values read are float32-aligned, so
// a shard reads them in place, and a later decode may reuse them.
func TestRowBlocksValuesAligned(t *testing.T) {
	blocks := []*pb.RowBlock{{Table: "a", SmallKeys: []uint64{1}, Values: wire.Bytes([]float32{1})},
		{Table: "bcd", SmallKeys: []uint64{1000}, Values: wire.Bytes([]float32{2, 3})}}
	b := appendBlocks(nil, fieldRequestTables, blocks)
	var d rowBlocks
	got, err := d.decode(b, fieldRequestTables)
	if err != nil {
		t.Fatal(err)
	}
	for i, blk := range got {
		if _, ok := wire.View(blk.Values); !ok {
			t.Errorf("block %d: values not float32-aligned", i)
		}
	}
}

// FuzzRowBlocks: whatever proto.Unmarshal reads as a push's tables the
// codec reads the same, and what the codec writes of them proto reads
// back the same.
func FuzzRowBlocks(f *testing.F) {
	for _, s := range codecSamples() {
		f.Add(appendBlocks(nil, fieldRequestTables, s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want pb.PushRowsRequest
		if proto.Unmarshal(b, &want) != nil {
			return
		}
		var d rowBlocks
		got, err := d.decode(b, fieldRequestTables)
		if err != nil || !sameBlocks(got, want.Tables) {
			t.Fatalf("read %v (%v), proto reads %v", got, err, want.Tables)
		}
		var back pb.PushRowsRequest
		if err := proto.Unmarshal(appendBlocks(nil, fieldRequestTables, got), &back); err != nil || !sameBlocks(back.Tables, want.Tables) {
			t.Fatalf("wrote what proto reads as %v (%v), want %v", back.Tables, err, want.Tables)
		}
	})
}
