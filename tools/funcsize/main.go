package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("funcsize", flag.ContinueOnError)
	fl.SetOutput(stderr)
	lim := Limits{}
	fl.IntVar(&lim.Lines, "lines", 80, "largest allowed function, in lines")
	fl.IntVar(&lim.Complexity, "complexity", 15, "largest allowed cyclomatic complexity")
	allowPath := fl.String("allow", "", "allowlist file of tolerated violations")
	write := fl.Bool("write", false, "rewrite the -allow file from today's violations")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() == 0 || (*write && *allowPath == "") {
		fmt.Fprintln(stderr, "usage: funcsize [-lines N] [-complexity N] [-allow FILE [-write]] DIR...")
		return 2
	}
	funcs, err := Measure(fl.Args())
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	switch {
	case *write:
		return writeAllowFile(*allowPath, funcs, lim, stderr)
	case *allowPath != "":
		return checkAllowFile(*allowPath, funcs, lim, stdout, stderr)
	}
	return report(funcs, lim, stdout)
}

// report prints every violation and returns 1 if there is any.
func report(funcs []Func, lim Limits, stdout io.Writer) int {
	status := 0
	for _, f := range funcs {
		if lim.Violates(f) {
			fmt.Fprintf(stdout, "%s:%d: %s: %d lines, complexity %d\n", f.File, f.Line, f.Name, f.Lines, f.Complexity)
			status = 1
		}
	}
	return status
}

func writeAllowFile(path string, funcs []Func, lim Limits, stderr io.Writer) int {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Functions over %d lines or cyclomatic complexity %d, tolerated until\n", lim.Lines, lim.Complexity)
	buf.WriteString("# refactored: LINES COMPLEXITY DIR NAME. See tools/funcsize/doc.go.\n")
	if err := WriteAllow(&buf, funcs, lim); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		fmt.Fprintf(stderr, "funcsize: %v\n", err)
		return 2
	}
	return 0
}

func checkAllowFile(path string, funcs []Func, lim Limits, stdout, stderr io.Writer) int {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(stderr, "funcsize: %v\n", err)
		return 2
	}
	defer f.Close()
	allow, err := ParseAllow(f)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	probs := Check(funcs, allow, lim)
	for _, p := range probs {
		fmt.Fprintln(stdout, p)
	}
	if len(probs) > 0 {
		fmt.Fprintf(stdout, "funcsize: %d problem(s) against %s\n", len(probs), path)
		return 1
	}
	return 0
}
