package main

import (
	"testing"

	"github.com/pstrain/pstrain/observe/report"
)

func TestLedgerText(t *testing.T) {
	for _, c := range []struct {
		l    []report.LedgerEntry
		want string
	}{
		{nil, ""},
		{[]report.LedgerEntry{{Epoch: 3}}, ""},
		{[]report.LedgerEntry{{Epoch: 0, Skipped: 1000}}, "data ledger: 1000 samples skipped, 0 read twice, in epoch 0 (report data_ledger)"},
		{[]report.LedgerEntry{{Epoch: 2, Skipped: 3000}, {Epoch: 4, Skipped: 2500}},
			"data ledger: 5500 samples skipped, 0 read twice, in 2 epochs from 2 to 4 (report data_ledger)"},
	} {
		if got := ledgerText(c.l); got != c.want {
			t.Errorf("ledgerText(%+v) = %q, want %q", c.l, got, c.want)
		}
	}
}
