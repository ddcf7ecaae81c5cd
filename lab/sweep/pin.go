package sweep

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ParseCPUList parses a Linux CPU list ("0-3,6", as in /proc/PID/status
// Cpus_allowed_list or taskset -c) into sorted, distinct CPU numbers.
func ParseCPUList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad CPU %q", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("cpu list %q: no CPUs", s)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatCPUList writes CPUs as a list in the kernel's style: runs of
// consecutive CPUs as ranges ("0-2,5").
func FormatCPUList(cpus []int) string {
	cs := slices.Clone(cpus)
	slices.Sort(cs)
	cs = slices.Compact(cs)
	var parts []string
	for i := 0; i < len(cs); {
		j := i
		for j+1 < len(cs) && cs[j+1] == cs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cs[i], cs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// CPUsAllowed reads the Cpus_allowed_list of a /proc/PID/status file.
func CPUsAllowed(statusPath string) ([]int, error) {
	f, err := os.Open(statusPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
			return ParseCPUList(v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%s: no Cpus_allowed_list", statusPath)
}

// OwnCPUs are the CPUs this process may run on: the ones a sweep pins its
// runs to (the first N of them for cpus=N).
func OwnCPUs() ([]int, error) { return CPUsAllowed("/proc/self/status") }

// checkCPUs checks a cpus value against the number of CPUs available.
func checkCPUs(v string, available int) error {
	if v == CPUsAll {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fmt.Errorf("cpus=%s: want a number of CPUs (at least 1) or %q", v, CPUsAll)
	}
	if n > available {
		return fmt.Errorf("cpus=%d: this machine lets the sweep use only %d CPUs", n, available)
	}
	return nil
}

// Command is the command line that starts one run: `EXE ARGS...`, or,
// pinned to cpus of the allowed CPUs, `taskset -c LIST EXE ARGS...` with
// LIST the first cpus of allowed. taskset sets the affinity and execs EXE,
// so the run keeps the process ID the sweep started and every task it
// starts inherits the affinity.
func Command(exe string, args []string, cpus string, allowed []int) (string, []string, error) {
	if cpus == CPUsAll || cpus == "" {
		return exe, slices.Clone(args), nil
	}
	if err := checkCPUs(cpus, len(allowed)); err != nil {
		return "", nil, err
	}
	n, _ := strconv.Atoi(cpus)
	sorted := slices.Clone(allowed)
	slices.Sort(sorted)
	argv := append([]string{"-c", FormatCPUList(sorted[:n]), exe}, args...)
	return "taskset", argv, nil
}
