package main

import (
	"fmt"

	"github.com/pstrain/pstrain/observe/report"
)

// ledgerText is the summary's line for the report's data ledger
// (docs/recovery.md, "Data positions"); "" when every epoch holds each
// of its samples once.
func ledgerText(l []report.LedgerEntry) string {
	var skipped, twice int64
	for _, e := range l {
		skipped += e.Skipped
		twice += e.ReadTwice
	}
	if skipped == 0 && twice == 0 {
		return ""
	}
	epochs := fmt.Sprintf("epoch %d", l[0].Epoch)
	if len(l) > 1 {
		epochs = fmt.Sprintf("%d epochs from %d to %d", len(l), l[0].Epoch, l[len(l)-1].Epoch)
	}
	return fmt.Sprintf("data ledger: %d samples skipped, %d read twice, in %s (report data_ledger)", skipped, twice, epochs)
}
