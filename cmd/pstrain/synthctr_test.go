package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/ml/ctrdata"
)

// `pstrain data synth-ctr` writes a set that opens, and prints the
// planted AUC its meta records.
func TestDataSynthCTR(t *testing.T) {
	out := filepath.Join(t.TempDir(), "set")
	var stdout, stderr bytes.Buffer
	args := []string{"data", "synth-ctr", "--out", out, "--train", "300", "--test", "200", "--seed", "7"}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	set, err := ctrdata.OpenSynth(out)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	m := set.Meta
	if set.Train.Len() != 300 || set.Test.Len() != 200 || m.Config.Seed != 7 {
		t.Errorf("wrote %d/%d samples with seed %d", set.Train.Len(), set.Test.Len(), m.Config.Seed)
	}
	if want := fmt.Sprintf("auc %.4f", m.PlantedAUC); !strings.Contains(stdout.String(), want) {
		t.Errorf("output does not print the planted %q:\n%s", want, stdout.String())
	}
}

func TestDataSynthCTRBadValues(t *testing.T) {
	for _, bad := range [][]string{{"--zipf", "1"}, {"--train", "0"}, {"--test", "-3"}, {"--seed", "x"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"data", "synth-ctr", "--out", t.TempDir()}, bad...), &stdout, &stderr)
		if !errors.Is(err, errUsage) {
			t.Errorf("synth-ctr %v: err = %v, want a usage error (exit 2)", bad, err)
		}
	}
}
