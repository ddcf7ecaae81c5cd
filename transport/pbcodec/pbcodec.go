// Package pbcodec is the gRPC protobuf codec of pstrain's tasks: the
// encoding of grpc's own ("proto"), with its large messages marshalled
// into and unmarshalled from buffers of a pool of its own, Pool.
//
// Why: grpc's default pool has size classes of 256 B, 4, 16 and 32 KiB
// and 1 MiB, and clears the whole capacity of every buffer it hands out.
// A CTR step's row messages (30-300 KiB) each took a 1 MiB buffer
// cleared in full, once to marshal and once to unmarshal: a profile of
// the CTR cluster put 6% of a worker's CPU and 4% of a PS's in that
// clearing. Pool's classes are every power of two up to 4 MiB, and it
// clears nothing: marshalling writes every byte of the buffer it is
// given, unmarshalling copies what it keeps (proto.Unmarshal does not
// alias its input), and the buffer is gone back to the pool before
// anyone reads past them.
package pbcodec

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// Name is the codec's content subtype: grpc's protobuf one, so that a
// peer with grpc's default codec reads what this one writes.
const Name = "proto"

// pooledFrom is the smallest message marshalled into a pooled buffer
// (smaller ones get a buffer of their own, as grpc's codec does).
const pooledFrom = 1 << 10

// Codec is grpc's encoding.CodecV2 for protobuf messages over Pool.
// The zero value is not usable: New.
type Codec struct {
	pool *Pool
}

var _ encoding.CodecV2 = (*Codec)(nil)

// New returns a codec over a new Pool.
func New() *Codec { return &Codec{pool: NewPool()} }

// Name implements encoding.CodecV2.
func (c *Codec) Name() string { return Name }

// Marshal implements encoding.CodecV2.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("pbcodec: cannot marshal a %T, want a proto.Message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // the size just computed
	if size < pooledFrom {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := c.pool.Get(size)
	out, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		c.pool.Put(buf)
		return nil, err
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, c.pool)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("pbcodec: cannot unmarshal into a %T, want a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// maxClass is the largest size class (2^maxClass bytes): larger buffers
// are allocated and left to the collector.
const maxClass = 22

// Pool is a mem.BufferPool of buffers in power-of-two size classes up to
// 4 MiB. It does not clear the buffers it hands out: their bytes are
// the last user's until written. Safe for concurrent use.
type Pool struct {
	classes [maxClass + 1]sync.Pool
}

var _ mem.BufferPool = (*Pool)(nil)

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{} }

// class is the size class of a buffer of n bytes, n > 0: the smallest c
// with 2^c >= n.
func class(n int) int { return bits.Len(uint(n - 1)) }

// Get implements mem.BufferPool: a buffer of length n, its contents
// undefined.
func (p *Pool) Get(n int) *[]byte {
	if n <= 0 {
		b := []byte{}
		return &b
	}
	c := class(n)
	if c > maxClass {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<c)
	return &b
}

// Put implements mem.BufferPool: a buffer Get returned, or a prefix of
// one, goes back to its class; any other is dropped.
func (p *Pool) Put(b *[]byte) {
	n := cap(*b)
	if n == 0 || n&(n-1) != 0 {
		return // not a class's size: not one of ours
	}
	if c := class(n); c <= maxClass {
		*b = (*b)[:0]
		p.classes[c].Put(b)
	}
}
