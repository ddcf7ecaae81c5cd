package dataplane

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// A row request's payload is the protobuf encoding of its message's
// tables field, repeated RowBlock (proto/pstrain.proto; docs/wire.md).
// This file writes and reads exactly that encoding, without proto's
// reflection: a shard decodes every row request into its connection's
// buffers rather than new memory, and writes its answers from them.
// FuzzRowBlocks checks that what proto.Unmarshal reads the codec reads
// alike, and that proto.Unmarshal reads what the codec writes. (The
// codec skips fields other than the blocks without checking them as
// proto does: a row request's other fields are in the frame's header.)

// The field numbers of the row messages (proto/pstrain.proto).
const (
	fieldRequestTables  protowire.Number = 5 // PullRowsRequest.tables, PushRowsRequest.tables
	fieldResponseTables protowire.Number = 4 // PullRowsResponse.tables

	fieldBlockTable     protowire.Number = 1
	fieldBlockKeys      protowire.Number = 2
	fieldBlockValues    protowire.Number = 3
	fieldBlockSmallKeys protowire.Number = 4
)

// appendBlocks appends blocks as the repeated message field num, as
// proto.Marshal writes them (fields in number order, scalars packed).
func appendBlocks(b []byte, num protowire.Number, blocks []*pb.RowBlock) []byte {
	for _, blk := range blocks {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(blockSize(blk)))
		if blk.Table != "" {
			b = protowire.AppendTag(b, fieldBlockTable, protowire.BytesType)
			b = protowire.AppendString(b, blk.Table)
		}
		if len(blk.Keys) > 0 {
			b = protowire.AppendTag(b, fieldBlockKeys, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(8*len(blk.Keys)))
			for _, k := range blk.Keys {
				b = protowire.AppendFixed64(b, k)
			}
		}
		if len(blk.Values) > 0 {
			b = protowire.AppendTag(b, fieldBlockValues, protowire.BytesType)
			b = protowire.AppendBytes(b, blk.Values)
		}
		if len(blk.SmallKeys) > 0 {
			b = protowire.AppendTag(b, fieldBlockSmallKeys, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(varintsSize(blk.SmallKeys)))
			for _, k := range blk.SmallKeys {
				b = protowire.AppendVarint(b, k)
			}
		}
	}
	return b
}

// blocksSize is what appendBlocks appends.
func blocksSize(num protowire.Number, blocks []*pb.RowBlock) int {
	n := 0
	for _, blk := range blocks {
		n += protowire.SizeTag(num) + protowire.SizeBytes(blockSize(blk))
	}
	return n
}

// blockSize is the encoded size of one block's fields (every tag is one
// byte: the field numbers are below 16).
func blockSize(blk *pb.RowBlock) int {
	n := 0
	if blk.Table != "" {
		n += 1 + protowire.SizeBytes(len(blk.Table))
	}
	if len(blk.Keys) > 0 {
		n += 1 + protowire.SizeBytes(8*len(blk.Keys))
	}
	if len(blk.Values) > 0 {
		n += 1 + protowire.SizeBytes(len(blk.Values))
	}
	if len(blk.SmallKeys) > 0 {
		n += 1 + protowire.SizeBytes(varintsSize(blk.SmallKeys))
	}
	return n
}

func varintsSize(keys []uint64) int {
	n := 0
	for _, k := range keys {
		n += protowire.SizeVarint(k)
	}
	return n
}

// rowBlocks decodes payloads into buffers it keeps from one payload to
// the next: the blocks, their keys and their values (copied into
// float32-aligned memory, so that wire.Floats reads them in place). A
// payload's blocks are valid until the next decode.
type rowBlocks struct {
	blocks []*pb.RowBlock
	keys   []uint64
	values []float32
	room   int // values the payload being decoded can hold
}

// blockBytes is about what a decoded block takes (a pb.RowBlock and its
// pointer), for held.
const blockBytes = 160

// held is about what the decoder's buffers take.
func (d *rowBlocks) held() int {
	return 4*cap(d.values) + 8*cap(d.keys) + blockBytes*cap(d.blocks)
}

var errRowPayload = errors.New("not a valid encoding of row blocks")

// decode reads the blocks of field num out of b, skipping other fields
// as proto.Unmarshal does.
func (d *rowBlocks) decode(b []byte, num protowire.Number) ([]*pb.RowBlock, error) {
	d.keys, d.values, d.room = d.keys[:0], d.values[:0], len(b)/4
	n := 0
	defer func() {
		for _, blk := range d.blocks[n:] { // (what earlier payloads left: not kept alive)
			blk.Table, blk.Keys, blk.Values, blk.SmallKeys = "", nil, nil, nil
		}
	}()
	for len(b) > 0 {
		f, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return nil, errRowPayload
		}
		b = b[m:]
		if f != num || typ != protowire.BytesType {
			if m = protowire.ConsumeFieldValue(f, typ, b); m < 0 {
				return nil, errRowPayload
			}
			b = b[m:]
			continue
		}
		msg, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return nil, errRowPayload
		}
		b = b[m:]
		if n == len(d.blocks) {
			d.blocks = append(d.blocks, &pb.RowBlock{})
		}
		blk := d.blocks[n]
		blk.Table, blk.Keys, blk.Values, blk.SmallKeys = "", nil, nil, nil
		if err := d.block(msg, blk); err != nil {
			return nil, fmt.Errorf("block %d: %w", n, err)
		}
		n++
	}
	return d.blocks[:n], nil
}

// block reads one RowBlock's fields into blk.
func (d *rowBlocks) block(b []byte, blk *pb.RowBlock) error {
	at := [2]int{-1, -1} // where blk's keys and small keys start in d.keys
	for len(b) > 0 {
		f, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return errRowPayload
		}
		b = b[m:]
		switch {
		case f == fieldBlockTable && typ == protowire.BytesType:
			s, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(s) {
				return errRowPayload
			}
			blk.Table, m = string(s), n
		case f == fieldBlockValues && typ == protowire.BytesType:
			var v []byte
			if v, m = protowire.ConsumeBytes(b); m >= 0 {
				blk.Values = d.copyValues(v)
			}
		case f == fieldBlockKeys:
			m = d.blockKeys(blk, f, typ, b, &at[0])
		case f == fieldBlockSmallKeys:
			m = d.blockKeys(blk, f, typ, b, &at[1])
		default:
			m = protowire.ConsumeFieldValue(f, typ, b)
		}
		if m < 0 {
			return errRowPayload
		}
		b = b[m:]
	}
	return nil
}

// blockKeys reads a piece of blk's keys (f: keys or small_keys), which
// start at *at in d.keys (-1: none yet), and returns the bytes read
// (negative: malformed). A repeated field may come in pieces: a piece
// after the other key field's moves this field's keys after those.
func (d *rowBlocks) blockKeys(blk *pb.RowBlock, f protowire.Number, typ protowire.Type, b []byte, at *int) int {
	have := keysLen(blk, f)
	switch {
	case *at < 0:
		*at = len(d.keys)
	case *at+have != len(d.keys):
		moved := append([]uint64(nil), d.keys[*at:*at+have]...)
		*at, d.keys = len(d.keys), append(d.keys, moved...)
	}
	m := d.consumeKeys(f, typ, b)
	ks := d.keys[*at:len(d.keys):len(d.keys)]
	if f == fieldBlockKeys {
		blk.Keys = ks
	} else {
		blk.SmallKeys = ks
	}
	return m
}

func keysLen(blk *pb.RowBlock, f protowire.Number) int {
	if f == fieldBlockKeys {
		return len(blk.Keys)
	}
	return len(blk.SmallKeys)
}

// consumeKeys appends to d.keys the keys of field f (keys: fixed64;
// small_keys: varints), packed or one by one, and returns the bytes read
// (negative: malformed).
func (d *rowBlocks) consumeKeys(f protowire.Number, typ protowire.Type, b []byte) int {
	fixed := f == fieldBlockKeys
	switch {
	case typ == protowire.BytesType:
		p, m := protowire.ConsumeBytes(b)
		if m < 0 || fixed && len(p)%8 != 0 {
			return -1
		}
		for len(p) > 0 {
			var k uint64
			var n int
			if fixed {
				k, n = protowire.ConsumeFixed64(p)
			} else {
				k, n = protowire.ConsumeVarint(p)
			}
			if n < 0 {
				return -1
			}
			d.keys, p = append(d.keys, k), p[n:]
		}
		return m
	case fixed && typ == protowire.Fixed64Type:
		k, m := protowire.ConsumeFixed64(b)
		if m >= 0 {
			d.keys = append(d.keys, k)
		}
		return m
	case !fixed && typ == protowire.VarintType:
		k, m := protowire.ConsumeVarint(b)
		if m >= 0 {
			d.keys = append(d.keys, k)
		}
		return m
	}
	return protowire.ConsumeFieldValue(f, typ, b)
}

// copyValues copies v into d.values and returns the copy's bytes; a
// length that is not a whole number of float32s is kept as it is (the
// shard refuses it).
func (d *rowBlocks) copyValues(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	if len(v)%4 != 0 {
		return append([]byte(nil), v...)
	}
	if len(d.values)+len(v)/4 > cap(d.values) {
		// Room for every value the payload can hold, at once. (Earlier
		// blocks keep the memory they point into.)
		d.values = make([]float32, 0, max(len(v)/4, d.room, 2*cap(d.values)))
	}
	at := len(d.values)
	d.values = d.values[:at+len(v)/4]
	out := wire.Bytes(d.values[at:len(d.values):len(d.values)])
	copy(out, v)
	return out
}
