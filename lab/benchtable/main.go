// Command benchtable prints the BENCHMARKS.md table for the reports
// written by scripts/bench-default.sh.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/observe/report"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: benchtable DIR N")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := table(os.Args[1], n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// row renders one run: r is its report; wall holds "start end load1".
func row(i int, r *report.Report, wall string) string {
	var s, e, load float64
	fmt.Sscan(wall, &s, &e, &load)
	ttt := "not held"
	if r.TimeToTargetSeconds != nil {
		ttt = fmt.Sprintf("%.2f", *r.TimeToTargetSeconds)
	}
	var last []string
	for _, ev := range r.Evals[max(0, len(r.Evals)-3):] {
		mark := ""
		if ev.Subset {
			mark = "s"
		}
		last = append(last, fmt.Sprintf("%.2f%s", 100*ev.TestAccuracy, mark))
	}
	workers := 0.0
	for name, t := range r.Tasks {
		if strings.HasPrefix(name, "worker/") {
			workers += t.CPUSeconds
		}
	}
	chief := r.Tasks["chief"].CPUSeconds
	out := fmt.Sprintf("| %d | %.1f | %s | %.2f | %s / %d | %.2f%% | %s | %.0f | %.2f / %.2f (%.0f%%) |", i, load, ttt, e-s,
		r.StoppedBy, r.FinalStep, 100*r.TestAccuracy, strings.Join(last, ", "), r.SamplesPerSecond, chief, workers, 100*chief/max(workers, 1e-9))
	for _, t := range []string{"ps/0", "ps/1", "worker/0", "worker/1"} {
		tk := r.Tasks[t]
		out += fmt.Sprintf(" %.0f / %.2f |", float64(tk.PeakRSSBytes)/(1<<20), tk.CPUSeconds)
	}
	return out
}

func table(dir string, n int) error {
	fmt.Println("| run | load1 before | time to held 97.5% (s) | whole run (s) | stopped by / final step | final model's acc | last 3 evals (s: subset) | samples/s | chief / workers CPU s | ps/0 | ps/1 | worker/0 | worker/1 |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for i := 1; i <= n; i++ {
		r, err := report.Read(filepath.Join(dir, fmt.Sprintf("default-%d.json", i)))
		if err != nil {
			return err
		}
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("default-%d.wall", i)))
		fmt.Println(row(i, r, string(b)))
	}
	return nil
}
