package main

import (
	"fmt"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/observe/report"
)

// inspectData checks the run's data set before any task starts and
// returns its shape. For a CTR model (ctrdata) the set is opened, its
// headers checked, and its shape given as TrainN, TestN, Dim the dense
// fields and Classes the categorical ones (what specOf reads back).
func inspectData(r config.Run) (dataset.Shape, error) {
	if !r.Model.IsCTR() {
		return dataset.Inspect(r.DataDir, r.Dataset)
	}
	set, err := ctrdata.Open(r.DataDir, r.Dataset)
	if err != nil {
		return dataset.Shape{}, err
	}
	defer set.Close()
	s := set.Train.Schema()
	return dataset.Shape{TrainN: set.Train.Len(), TestN: set.Test.Len(), Dim: s.Dense, Classes: s.Cat}, nil
}

// specOf is the run's model on data of shape (inspectData's).
func specOf(r config.Run, shape dataset.Shape) model.Spec {
	if r.Model.IsCTR() {
		return r.CTRSpec(shape.Dim, shape.Classes)
	}
	return r.Spec(shape.Dim, shape.Classes)
}

// ctrScoresText is the summary line of a CTR model's scores.
func ctrScoresText(rep *report.Report) string {
	s := fmt.Sprintf("test auc %.4f, logloss %.4f, normalized entropy %.4f", rep.AUC, rep.LogLoss, rep.NormalizedEntropy)
	if rep.PlantedAUC > 0 {
		s += fmt.Sprintf(" (planted model's auc %.4f)", rep.PlantedAUC)
	}
	return s
}
