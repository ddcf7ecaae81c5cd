package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// freeTaskPorts returns n ports p that are free together with p+1000 (a
// task's default metrics port) and p+2000 (a PS's default data plane), on
// every interface.
func freeTaskPorts(t *testing.T, n int) []int {
	t.Helper()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 100 {
			t.Fatal("no free port with +1000 and +2000 free too")
		}
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		group := []net.Listener{l}
		for _, off := range []int{1000, 2000} {
			if p+off > 65535 {
				break
			}
			if l2, err := net.Listen("tcp", ":"+strconv.Itoa(p+off)); err == nil {
				group = append(group, l2)
			}
		}
		held = append(held, group...)
		if len(group) == 3 {
			out = append(out, p)
		}
	}
	return out
}

// TestTFConfigAloneStartsEveryTask starts a cluster the way Kubeflow's
// TFJob operator does: every task gets TF_CONFIG and only the flags a pod
// would have (data, checkpoint and report paths, the run's secret, --insecure); no --ps,
// --workers or --index. The chief is called "master" (older TFJobs), the
// worker is started as `pstrain task` (its role too from TF_CONFIG), and
// its address is a host name that resolves nowhere, as a pod's name may
// not inside the pod: nobody dials a worker, and its metrics endpoint must
// bind every interface instead of looking the name up. The run trains to
// the end; the chief prints the summary and writes checkpoints and the
// report.
func TestTFConfigAloneStartsEveryTask(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	p := freeTaskPorts(t, 3)
	workerHost := "pstrain-worker-0.invalid" // RFC 6761: never resolves
	clusterJSON := fmt.Sprintf(`{"master":["127.0.0.1:%d"],"ps":["127.0.0.1:%d"],"worker":["%s:%d"]}`, p[0], p[1], workerHost, p[2])
	tfConfig := func(typ string) string {
		return fmt.Sprintf(`TF_CONFIG={"cluster":%s,"task":{"type":%q,"index":0},"environment":"cloud"}`, clusterJSON, typ)
	}
	ckpt := filepath.Join(tmp, "checkpoints")
	pod := []string{"--insecure", "--auth-token-file", tokenFile(t), "--connect-timeout", "1m", "--data-dir", d, "--data-fraction", "0.1", "--epochs", "1", "--target-accuracy", "0"}
	c := startTask(t, []string{tfConfig("master")}, append([]string{"chief", "--checkpoint-dir", ckpt, "--report", filepath.Join(tmp, "r.json")}, pod...)...)
	ps := startTask(t, []string{tfConfig("ps")}, append([]string{"ps", "--checkpoint-dir", ckpt}, pod...)...)
	w := startTask(t, []string{tfConfig("worker")}, append([]string{"task"}, pod...)...)
	for name, pr := range map[string]*proc{"chief": c, "ps": ps, "worker": w} {
		if err := pr.wait(t, 2*time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, pr.out.String())
		}
	}
	// The worker served metrics on its port + 1000 without resolving its name.
	if want := fmt.Sprintf("addr=%s:%d", workerHost, p[2]+1000); !strings.Contains(w.out.String(), want) {
		t.Errorf("worker output has no %q (metrics endpoint up):\n%s", want, w.out.String())
	}
	rep, err := report.Read(filepath.Join(tmp, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.PS != 1 || rep.Workers != 1 || rep.StoppedBy != "epochs" || rep.TestAccuracy < 0.8 {
		t.Fatalf("report: %d PS, %d workers, stopped by %q, accuracy %.4f; want 1, 1, epochs, >= 0.8", rep.PS, rep.Workers, rep.StoppedBy, rep.TestAccuracy)
	}
	out := c.out.String()
	if !strings.Contains(out, "== pstrain summary ==") || !strings.Contains(out, "stopped by: epochs") {
		t.Errorf("the chief printed no summary:\n%s", out)
	}
	if infos, err := checkpoint.NewStore(checkpoint.OSFS{}, ckpt, 0).List(); err != nil || len(infos) == 0 {
		t.Errorf("no checkpoint in %s: %v %v", ckpt, infos, err)
	}
	if strings.Count(out, "self=chief") == 0 || strings.Contains(ps.out.String(), "task=ps/0") {
		t.Errorf("log lines: the process is self=..., task= is for other tasks:\nchief:\n%s\nps:\n%s", out, ps.out.String())
	}
}
