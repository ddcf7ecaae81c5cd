package launcher

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
)

// testPlan plans a run of 2 shards with standbys, 2 workers of 3 slots,
// on ports 1000, 1001, ...
func testPlan(t *testing.T, metricsBase int) (Config, plan) {
	t.Helper()
	c := Config{Run: config.Run{PS: 2, PSReplicas: 1, Workers: 2, MaxWorkers: 3}, Dir: "/run", MetricsPortBase: metricsBase,
		ChildArgs: func(r config.Run) []string { return []string{fmt.Sprintf("--workers=%d", r.Workers)} }, ExtraArgs: []string{"--x"}}
	ports := make([]int, portCount(c))
	for i := range ports {
		ports[i] = 1000 + i
	}
	p, err := planRun(c, "run-7", ports)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func TestPlanLaysOutPortsAndTasks(t *testing.T) {
	c, p := testPlan(t, 0)
	// 1 chief + 2 PS + 3 slots + 2 standbys = 8 tasks: 16 ports, then 4
	// data planes.
	if n := portCount(c); n != 20 {
		t.Fatalf("portCount = %d, want 20", n)
	}
	want := cluster.Spec{Chief: []string{"127.0.0.1:1000"}, PS: []string{"127.0.0.1:1001", "127.0.0.1:1002"},
		Worker:  []string{"127.0.0.1:1003", "127.0.0.1:1004", "127.0.0.1:1005"},
		Standby: []string{"127.0.0.1:1006", "127.0.0.1:1007"}}
	if string(p.spec.JSON()) != string(want.JSON()) {
		t.Fatalf("spec = %s, want %s", p.spec.JSON(), want.JSON())
	}
	var names []string
	for _, i := range p.initial {
		names = append(names, p.tasks[i].String())
	}
	if got := strings.Join(names, " "); got != "chief ps/0 ps/1 worker/0 worker/1 standby/0 standby/1" {
		t.Fatalf("initial tasks = %q (worker/2 is a slot)", got)
	}
	if p.metricsAddr(0) != "127.0.0.1:1008" || p.metricsAddr(7) != "127.0.0.1:1015" {
		t.Fatalf("metrics = %q", p.metrics)
	}
	if k := p.workerIndex(2); p.tasks[k] != (cluster.Task{Type: cluster.Worker, Index: 2}) {
		t.Fatalf("workerIndex(2) = %d: %v", k, p.tasks[k])
	}
	if got := p.logPath(p.tasks[1]); got != "/run/logs/ps-0.log" {
		t.Fatalf("logPath = %q", got)
	}
}

func TestPlanArgs(t *testing.T) {
	_, p := testPlan(t, 9000)
	cases := map[int][]string{
		0: {"chief", "--cluster=/run/cluster.json", "--metrics-addr=127.0.0.1:9000", "--report=/run/chief-report.json",
			"--progress", "--run-id=run-7", "--state-file=/run/chief-state.json", "--scale-file=/run/" + ScaleRequestFile,
			"--workers=2", "--x"},
		2: {"ps", "--cluster=/run/cluster.json", "--metrics-addr=127.0.0.1:9002", "--data-addr=127.0.0.1:1017", "--index=1", "--workers=2", "--x"},
		5: {"worker", "--cluster=/run/cluster.json", "--metrics-addr=127.0.0.1:9005", "--index=2", "--workers=2", "--x"},
		7: {"standby", "--cluster=/run/cluster.json", "--metrics-addr=127.0.0.1:9007", "--data-addr=127.0.0.1:1019", "--index=1", "--workers=2", "--x"},
	}
	for i, want := range cases {
		if !slices.Equal(p.args[i], want) {
			t.Errorf("args of %s:\n got %q\nwant %q", p.tasks[i], p.args[i], want)
		}
	}
}

func TestPlanWantsItsPorts(t *testing.T) {
	c := Config{Run: config.Run{PS: 1, Workers: 1}}
	if _, err := planRun(c, "r", []int{1, 2}); err == nil {
		t.Fatal("a plan with too few ports: no error")
	}
}

// TestPlanStandbySlots: with hot standbys and PS slots past --ps, the
// cluster lists a standby slot beside every PS slot (each with its own
// data plane); the first --ps of each start at launch, and
// standbyIndex finds a slot's standby.
func TestPlanStandbySlots(t *testing.T) {
	c := Config{Run: config.Run{PS: 2, MaxPS: 3, PSReplicas: 1, Workers: 1, MaxWorkers: 1}, Dir: "/run"}
	ports := make([]int, portCount(c))
	for i := range ports {
		ports[i] = 2000 + i
	}
	// 1 chief + 3 PS slots + 1 worker + 3 standby slots = 8 tasks: 16
	// ports, then 6 data planes.
	if len(ports) != 22 {
		t.Fatalf("portCount = %d, want 22", len(ports))
	}
	p, err := planRun(c, "run-8", ports)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.spec.Validate(); err != nil || len(p.spec.PS) != 3 || len(p.spec.Standby) != 3 {
		t.Fatalf("spec %s (%v): want 3 PS slots and 3 standby slots", p.spec.JSON(), err)
	}
	var names []string
	for _, i := range p.initial {
		names = append(names, p.tasks[i].String())
	}
	if got := strings.Join(names, " "); got != "chief ps/0 ps/1 worker/0 standby/0 standby/1" {
		t.Fatalf("initial tasks = %q (ps/2 and standby/2 are slots)", got)
	}
	if k := p.standbyIndex(2); p.tasks[k] != (cluster.Task{Type: cluster.Standby, Index: 2}) {
		t.Fatalf("standbyIndex(2) = %d: %v", k, p.tasks[k])
	}
	datas := map[string]bool{}
	for i, a := range p.args {
		for _, x := range a {
			if d, ok := strings.CutPrefix(x, "--data-addr="); ok {
				if datas[d] {
					t.Errorf("%s's data plane %s is another task's", p.tasks[i], d)
				}
				datas[d] = true
			}
		}
	}
	if len(datas) != 6 {
		t.Errorf("%d data planes, want one per PS and standby slot (6)", len(datas))
	}
}
