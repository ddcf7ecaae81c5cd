package convert

import (
	"reflect"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"google.golang.org/protobuf/proto"
)

// roundTrip is m encoded and decoded, as a peer receives it.
func roundTrip[M proto.Message](t *testing.T, m M, into M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
	return into
}

func TestModelSpecSurvivesTheWire(t *testing.T) {
	r := config.Default()
	cnn := r
	cnn.Model = model.KindCNN
	ctr := r
	ctr.EmbeddingDim = 8
	for _, s := range []model.Spec{r.Spec(784, 10), cnn.Spec(784, 10), {Input: 3, Classes: 2}, ctr.CTRSpec(13, 26)} {
		got := Spec(roundTrip(t, ModelSpec(s), &pb.ModelSpec{}))
		if !got.Equal(s) {
			t.Errorf("%s came back as %s", s.JSON(), got.JSON())
		}
	}
	if s := Spec(nil); !s.Equal(model.Spec{}) {
		t.Errorf("no spec read as %+v", s)
	}
}

func TestDataPlanSurvivesTheWireAndIsValidated(t *testing.T) {
	for _, p := range []dataset.DataPlan{dataset.NewDataPlan(60000, 32, 2).Scale(40, 3, 5),
		dataset.NewQueuePlan(60000, 32, 3).Lease(0, 2).Lease(2, 3).Scale(40, 3, 2)} {
		got, err := Plan(roundTrip(t, DataPlan(p), &pb.DataPlan{}))
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("plan %+v came back as %+v (%v)", p, got, err)
		}
	}
	if _, err := Plan(&pb.DataPlan{N: 10, Batch: 0, Eras: []*pb.Era{{Workers: 1}}}); err == nil || !strings.Contains(err.Error(), "batch") {
		t.Errorf("a plan of batch 0 read without error: %v", err)
	}
	if _, err := Plan(nil); err == nil {
		t.Error("no plan read without error")
	}
}

func TestSettingsSurviveTheWire(t *testing.T) {
	r := config.Default()
	got := RunSettings(roundTrip(t, &pb.RegisterRequest{Settings: Settings(r)}, &pb.RegisterRequest{}).Settings)
	if d := config.DiffSettings(r.Settings(), got); len(d) != 0 {
		t.Errorf("the run's own settings differ after the trip: %q", d)
	}
	other := r
	other.LR = r.LR / 2
	if d := config.DiffSettings(r.Settings(), RunSettings(Settings(other))); len(d) != 1 || !strings.HasPrefix(d[0], "lr: ") {
		t.Errorf("a task with another lr: %q", d)
	}
	if d := config.DiffSettings(r.Settings(), nil); len(d) != len(r.Settings()) || !strings.Contains(d[0], "none (this task)") {
		t.Errorf("a task that sent no settings: %q", d)
	}
}
