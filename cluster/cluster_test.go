package cluster

import (
	"strings"
	"testing"
)

func TestParseTFConfigAndPlainFile(t *testing.T) {
	tf := `{"cluster":{"chief":["c:1"],"ps":["p0:2","p1:3"],"worker":["w0:4"]},"task":{"type":"ps","index":1}}`
	s, task, err := Parse([]byte(tf))
	if err != nil || task == nil || *task != (Task{PS, 1}) || len(s.PS) != 2 {
		t.Fatalf("TF_CONFIG: %+v %v %v", s, task, err)
	}
	if a, _ := s.Addr(*task); a != "p1:3" {
		t.Fatalf("addr %q", a)
	}
	s2, task2, err := Parse(s.JSON())
	if err != nil || task2 != nil || len(s2.Tasks()) != 4 {
		t.Fatalf("plain: %+v %v %v", s2, task2, err)
	}
}

func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		`{"chief":[],"ps":["a:1"],"worker":["b:2"]}`:                                                  "one chief",
		`{"chief":["c:1"],"ps":[],"worker":["b:2"]}`:                                                  "ps",
		`{"chief":["c:1"],"ps":["a"],"worker":["b:2"]}`:                                               "address",
		`{"chief":["c:1"],"ps":["a:1"],"worker":["a:1"]}`:                                             "share",
		`{"cluster":{"chief":["c:1"],"ps":["a:1"],"worker":["b:2"]},"task":{"type":"ps","index":4}}`:  "index 4",
		`{"cluster":{"chief":["c:1"],"ps":["a:1"],"worker":["b:2"]},"task":{"type":"gpu","index":0}}`: "unknown task type",
		`not json`: "cluster",
	} {
		if _, _, err := Parse([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want error containing %q", in, err, want)
		}
	}
	if _, _, err := Load("", ""); err == nil || !strings.Contains(err.Error(), "TF_CONFIG") {
		t.Errorf("no source: %v", err)
	}
}

func TestParseTask(t *testing.T) {
	for in, want := range map[string]Task{"chief": {Type: Chief}, "ps/3": {PS, 3}, "worker/0": {Worker, 0}} {
		got, err := ParseTask(in)
		if err != nil || got != want || (in != "chief" && got.String() != in) {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"ps", "ps/-1", "gpu/0", "worker/x"} {
		if _, err := ParseTask(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"cluster":{"chief":["c:1"],"ps":["p0:2"],"worker":["w0:4"]},"task":{"type":"ps","index":0}}`))
	f.Add([]byte(`{"chief":["c:1"],"ps":["p0:2"],"worker":["w0:4"]}`))
	f.Add([]byte(`{"task":{"type":"worker","index":-1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, task, err := Parse(b)
		if err != nil {
			return
		}
		// Anything accepted must be self-consistent.
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted an invalid spec: %v", err)
		}
		if task != nil {
			if _, err := s.Addr(*task); err != nil {
				t.Fatalf("accepted a task not in the cluster: %v", err)
			}
		}
	})
}

// Older TFJobs (and TensorFlow 1 estimators) call the chief "master", in
// the cluster and in the task.
func TestMasterIsTheChief(t *testing.T) {
	tf := `{"cluster":{"master":["m:1"],"ps":["p0:2"],"worker":["w0:3"]},"task":{"type":"master","index":0},"environment":"cloud"}`
	s, task, err := Parse([]byte(tf))
	if err != nil {
		t.Fatal(err)
	}
	if task == nil || *task != (Task{Type: Chief}) {
		t.Fatalf("task %+v, want the chief", task)
	}
	if a, err := s.Addr(*task); err != nil || a != "m:1" {
		t.Fatalf("chief address %q, %v; want m:1", a, err)
	}
	// A plain cluster file may say master too.
	if s, _, err := Parse([]byte(`{"master":["m:1"],"ps":["p0:2"],"worker":["w0:3"]}`)); err != nil || s.Chief[0] != "m:1" {
		t.Fatalf("plain file with master: %+v %v", s, err)
	}
	if _, _, err := Parse([]byte(`{"chief":["c:1"],"master":["m:1"],"ps":["p0:2"],"worker":["w0:3"]}`)); err == nil || !strings.Contains(err.Error(), "both chief and master") {
		t.Fatalf("chief and master both: %v", err)
	}
}

func TestFirstOnHost(t *testing.T) {
	s := Spec{Chief: []string{"a:1"}, PS: []string{"b:2", "a:3"}, Worker: []string{"b:4", "c:5", "c:6"}}
	want := map[Task]bool{
		{Type: Chief}: true, {PS, 0}: true, {PS, 1}: false,
		{Worker, 0}: false, {Worker, 1}: true, {Worker, 2}: false,
	}
	for task, w := range want {
		if got := s.FirstOnHost(task); got != w {
			t.Errorf("FirstOnHost(%s) = %v, want %v", task, got, w)
		}
	}
	if s.FirstOnHost(Task{Worker, 9}) {
		t.Error("a task not in the cluster is first on its host")
	}
}
