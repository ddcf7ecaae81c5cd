package sweep

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestScheduleKeys(t *testing.T) {
	g, err := ParseGrid("lr-schedule=constant,cosine,step:1:0.5;warmup-steps=0,100")
	if err != nil {
		t.Fatal(err)
	}
	want := Grid{{"lr-schedule", []string{"constant", "cosine", "step:1:0.5"}}, {"warmup-steps", []string{"0", "100"}}}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("got %v", g)
	}
	cs, err := g.Expand(fakeResolve, 2)
	if err != nil || len(cs) != 6 {
		t.Fatalf("%d configurations, %v", len(cs), err)
	}
	ids := map[string]bool{}
	for _, c := range cs {
		ids[c.ID] = true
	}
	if len(ids) != 6 {
		t.Errorf("%d distinct IDs, want 6", len(ids))
	}
}

// A configuration at the values every run had before the schedule keys
// existed keeps its ID, so older sweep directories still resume.
func TestLaterKeysKeepOldIDs(t *testing.T) {
	old := map[string]string{}
	for _, k := range Keys() {
		if _, later := laterKeys[k]; !later {
			old[k] = "1"
		}
	}
	now := map[string]string{"lr-schedule": "constant", "warmup-steps": "0"}
	for k, v := range old {
		now[k] = v
	}
	if configID(old) != configID(now) {
		t.Errorf("ID changed: %s before the keys, %s with their old values", configID(old), configID(now))
	}
	now["lr-schedule"] = "cosine"
	if configID(old) == configID(now) {
		t.Error("a cosine configuration has the constant one's ID")
	}
	for k := range laterKeys {
		if !isKey(k) {
			t.Errorf("laterKeys names %q, not a key", k)
		}
	}
}

// model and cpus are checked when the grid is parsed (values) and
// expanded (cpus against the machine); cpus never reaches the resolver.
func TestModelAndCPUsKeys(t *testing.T) {
	for spec, want := range map[string]string{
		"model=mlp,rnn": "model=rnn: want one of mlp, cnn",
		"cpus=0":        "cpus=0: want a number of CPUs",
		"cpus=two":      "cpus=two",
	} {
		if _, err := ParseGrid(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseGrid(%q) = %v, want %q", spec, err, want)
		}
	}
	g, err := ParseGrid("model=mlp,cnn;cpus=1,2,all")
	if err != nil {
		t.Fatal(err)
	}
	var sawCPUs bool
	resolve := func(p map[string]string) (map[string]string, error) {
		_, sawCPUs = p[KeyCPUs]
		return fakeResolve(p)
	}
	cs, err := g.Expand(resolve, 2)
	if err != nil || len(cs) != 6 {
		t.Fatalf("%d configurations, %v", len(cs), err)
	}
	if sawCPUs {
		t.Error("the resolver was given cpus")
	}
	var got []string
	for _, c := range cs {
		got = append(got, c.Params["model"]+"/"+c.Params[KeyCPUs])
	}
	if want := []string{"mlp/1", "mlp/2", "mlp/all", "cnn/1", "cnn/2", "cnn/all"}; !reflect.DeepEqual(got, want) {
		t.Errorf("configurations %v, want %v", got, want)
	}
	if _, err := g.Expand(resolve, 1); err == nil || !strings.Contains(err.Error(), "cpus=2: this machine lets the sweep use only 1 CPUs") {
		t.Errorf("cpus=2 on 1 CPU: %v", err)
	}
	// The defaults keep the IDs configurations had before the keys.
	d, _ := ParseGrid("workers=2")
	e, _ := ParseGrid("workers=2;model=mlp;cpus=all")
	c1, _ := d.Expand(fakeResolve, 2)
	c2, _ := e.Expand(fakeResolve, 2)
	if c1[0].ID != c2[0].ID {
		t.Errorf("model=mlp cpus=all changed the ID: %s, %s", c1[0].ID, c2[0].ID)
	}
}

// Every key but cpus is a run flag; model=mlp (the default) is left out
// so a binary without --model runs it, other models are passed.
func TestRunFlags(t *testing.T) {
	p, _ := fakeResolve(map[string]string{"mode": "ssp", "staleness": "3", "hidden": "256,128", "replicas-to-aggregate": "1", "seed": "7"})
	p[KeyCPUs] = "1"
	flags := RunFlags(p, 9)
	joined := " " + strings.Join(flags, " ") + " "
	for _, want := range []string{" --mode=ssp ", " --staleness=3 ", " --hidden=256,128 ", " --replicas-to-aggregate=1 ", " --seed=9 ",
		" --batch=1 ", " --lr=1 ", " --optimizer=1 "} {
		if !strings.Contains(joined, want) {
			t.Errorf("flags %v lack %q", flags, want)
		}
	}
	if strings.Contains(joined, "--cpus") || strings.Contains(joined, "--model") {
		t.Errorf("flags %v pass cpus or model=mlp", flags)
	}
	if len(flags) != len(Keys())-2 {
		t.Errorf("%d flags for %d keys", len(flags), len(Keys()))
	}
	p["model"] = "cnn"
	if f := RunFlags(p, 9); !slices.Contains(f, "--model=cnn") {
		t.Errorf("model=cnn not passed: %v", f)
	}
}
