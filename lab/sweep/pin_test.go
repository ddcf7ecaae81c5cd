package sweep

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestCPUList(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "0-3": {0, 1, 2, 3}, "0-1,4,6-7\n": {0, 1, 4, 6, 7}, "3,1,1": {1, 3}} {
		got, err := ParseCPUList(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "1-x"} {
		if got, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q) = %v, want an error", bad, got)
		}
	}
	for want, in := range map[string][]int{"0": {0}, "0-2,5": {5, 0, 1, 2}, "1,3": {3, 1}, "0-1,3-4": {0, 1, 3, 4}} {
		if got := FormatCPUList(in); got != want {
			t.Errorf("FormatCPUList(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestCPUsAllowed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "status")
	os.WriteFile(p, []byte("Name:\tpstrain\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n"), 0o644)
	if got, err := CPUsAllowed(p); err != nil || !reflect.DeepEqual(got, []int{0, 1}) {
		t.Errorf("CPUsAllowed = %v, %v", got, err)
	}
	own, err := OwnCPUs()
	if err != nil || len(own) == 0 {
		t.Errorf("OwnCPUs = %v, %v", own, err)
	}
}

// The pinned command line: taskset -c with the first N allowed CPUs
// around the unchanged run command; no taskset when unpinned; more CPUs
// than allowed refused.
func TestCommand(t *testing.T) {
	args := []string{"run", "--workers=2"}
	name, argv, err := Command("/bin/pstrain", args, "2", []int{5, 1, 3})
	if err != nil || name != "taskset" || !reflect.DeepEqual(argv, []string{"-c", "1,3", "/bin/pstrain", "run", "--workers=2"}) {
		t.Errorf("cpus=2: %s %v %v", name, argv, err)
	}
	name, argv, err = Command("/bin/pstrain", args, "1", []int{0, 1})
	if err != nil || name != "taskset" || strings.Join(argv, " ") != "-c 0 /bin/pstrain run --workers=2" {
		t.Errorf("cpus=1: %s %v %v", name, argv, err)
	}
	name, argv, err = Command("/bin/pstrain", args, CPUsAll, nil)
	if err != nil || name != "/bin/pstrain" || !reflect.DeepEqual(argv, args) {
		t.Errorf("cpus=all: %s %v %v", name, argv, err)
	}
	if _, _, err := Command("/bin/pstrain", args, "3", []int{0, 1}); err == nil || !strings.Contains(err.Error(), "only 2 CPUs") {
		t.Errorf("cpus=3 of 2: %v", err)
	}
}
