package testbin

import (
	"os"
	"path/filepath"
	"testing"
)

func TestModuleRootHoldsThisModule(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "pstrain", "main.go")); err != nil {
		t.Fatalf("module root %s has no cmd/pstrain: %v", root, err)
	}
	if wd, _ := os.Getwd(); filepath.Join(root, "internal", "testbin") != wd {
		t.Fatalf("module root %s is not two levels above %s", root, wd)
	}
}
