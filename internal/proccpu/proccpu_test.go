package proccpu

import (
	"testing"
	"time"
)

// Work done shows as CPU time, and the time never goes back.
func TestSelfGrowsWithWork(t *testing.T) {
	before, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	x := 1.0
	for deadline := time.Now().Add(50 * time.Millisecond); time.Now().Before(deadline); {
		for range 1000 {
			x = x*1.0000001 + 1e-9
		}
	}
	after, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("CPU time %v after 50 ms of work, %v before (x %v)", after, before, x)
	}
}
