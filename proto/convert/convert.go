// Package convert turns the wire's protobuf messages into the domain
// types of the packages that do not know the wire (ml/model, ml/dataset)
// and back. The shard's own messages (ShardOptions, ShardState) are
// converted by package ps.
package convert

import (
	"fmt"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
)

// ModelSpec is s on the wire.
func ModelSpec(s model.Spec) *pb.ModelSpec {
	return &pb.ModelSpec{Kind: s.Kind, Input: int32(s.Input), Hidden: int32s(s.Hidden), Classes: int32(s.Classes),
		Height: int32(s.Height), Width: int32(s.Width), Conv: int32s(s.Conv),
		Fields: int32(s.Fields), EmbeddingDim: int32(s.EmbeddingDim)}
}

// Spec is the model spec m carries (the zero Spec for nil). Its list
// fields are nil when empty, as model.Spec's JSON decodes them.
func Spec(m *pb.ModelSpec) model.Spec {
	return model.Spec{Kind: m.GetKind(), Input: int(m.GetInput()), Hidden: ints(m.GetHidden()),
		Classes: int(m.GetClasses()), Height: int(m.GetHeight()), Width: int(m.GetWidth()), Conv: ints(m.GetConv()),
		Fields: int(m.GetFields()), EmbeddingDim: int(m.GetEmbeddingDim())}
}

// DataPlan is p on the wire.
func DataPlan(p dataset.DataPlan) *pb.DataPlan {
	m := &pb.DataPlan{N: int64(p.N), Batch: int32(p.Batch), Eras: make([]*pb.Era, len(p.Eras)), Hold: p.Hold,
		Chunk: int32(p.Chunk), NextChunk: p.NextChunk}
	for i, e := range p.Eras {
		m.Eras[i] = &pb.Era{Epoch: e.Epoch, Step: e.Step, Workers: int32(e.Workers)}
	}
	for _, ls := range p.Leases {
		pl := &pb.Leases{}
		for _, l := range ls {
			pl.First, pl.Count = append(pl.First, l.First), append(pl.Count, l.Count)
		}
		m.Leases = append(m.Leases, pl)
	}
	return m
}

// Plan is the data plan m carries, validated (dataset.DataPlan.Validate).
func Plan(m *pb.DataPlan) (dataset.DataPlan, error) {
	p := dataset.DataPlan{N: int(m.GetN()), Batch: int(m.GetBatch()), Eras: make([]dataset.Era, len(m.GetEras())), Hold: m.GetHold()}
	for i, e := range m.GetEras() {
		p.Eras[i] = dataset.Era{Epoch: e.Epoch, Step: e.Step, Workers: int(e.Workers)}
	}
	p.Chunk, p.NextChunk = int(m.GetChunk()), m.GetNextChunk()
	for _, pl := range m.GetLeases() {
		if len(pl.GetFirst()) != len(pl.GetCount()) {
			return p, fmt.Errorf("data plan: leases of %d firsts and %d counts", len(pl.GetFirst()), len(pl.GetCount()))
		}
		var ls []dataset.Lease
		for i, f := range pl.GetFirst() {
			ls = append(ls, dataset.Lease{First: f, Count: pl.GetCount()[i]})
		}
		p.Leases = append(p.Leases, ls)
	}
	return p, p.Validate()
}

func int32s(xs []int) []int32 {
	if xs == nil {
		return nil
	}
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

func ints(xs []int32) []int {
	if len(xs) == 0 {
		return nil
	}
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

// Settings are r's values every task must share
// (RegisterRequest.settings; config.Run.Settings).
func Settings(r config.Run) []*pb.Setting {
	ss := r.Settings()
	out := make([]*pb.Setting, len(ss))
	for i, s := range ss {
		out[i] = &pb.Setting{Name: s.Name, Value: s.Value}
	}
	return out
}

// RunSettings are the settings ms carries.
func RunSettings(ms []*pb.Setting) []config.Setting {
	out := make([]config.Setting, len(ms))
	for i, m := range ms {
		out[i] = config.Setting{Name: m.GetName(), Value: m.GetValue()}
	}
	return out
}
