package sweep

import (
	"reflect"
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
	cs, err := g.Expand(fakeResolve)
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
