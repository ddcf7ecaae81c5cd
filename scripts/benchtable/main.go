// Command benchtable prints the BENCHMARKS.md table for the reports
// written by scripts/bench-default.sh.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/report"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: benchtable DIR N")
		os.Exit(2)
	}
	dir := os.Args[1]
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	tasks := []string{"chief", "ps/0", "ps/1", "worker/0", "worker/1"}
	fmt.Println("| run | time to 97.5% (s) | whole run (s) | startup (s) | samples/s | final acc | " + strings.Join(tasks, " RSS MiB / CPU s | ") + " RSS MiB / CPU s |")
	fmt.Println("|---|---|---|---|---|---|" + strings.Repeat("---|", len(tasks)))
	for i := 1; i <= n; i++ {
		r, err := report.Read(filepath.Join(dir, fmt.Sprintf("default-%d.json", i)))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("default-%d.wall", i)))
		var s, e float64
		fmt.Sscan(string(b), &s, &e)
		ttt := "not reached"
		if r.TimeToTargetSeconds != nil {
			ttt = fmt.Sprintf("%.2f", *r.TimeToTargetSeconds)
		}
		row := fmt.Sprintf("| %d | %s | %.2f | %.2f | %.0f | %.2f%% |", i, ttt, e-s, r.StartupSeconds, r.SamplesPerSecond, 100*r.TestAccuracy)
		for _, t := range tasks {
			tk := r.Tasks[t]
			row += fmt.Sprintf(" %.0f / %.2f |", float64(tk.PeakRSSBytes)/(1<<20), tk.CPUSeconds)
		}
		fmt.Println(row)
	}
}
