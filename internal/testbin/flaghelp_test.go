package testbin

import (
	"slices"
	"testing"
)

func TestBadFlagLines(t *testing.T) {
	help := "flags:\n  -batch int\n    \tper-worker batch size\n  -max-workers pstrain scale\n    \tmost workers\n" +
		"  -once\n    \tone frame\n  -out DIR\n    \twhere\n  -web.config.file string\n    \tweb config\n  -x thing\n    \tsomething\n"
	if got, want := BadFlagLines(help), []string{"-max-workers pstrain scale", "-x thing"}; !slices.Equal(got, want) {
		t.Errorf("BadFlagLines = %q, want %q", got, want)
	}
	if got, want := FlagNames(help), []string{"batch", "max-workers", "once", "out", "web.config.file", "x"}; !slices.Equal(got, want) {
		t.Errorf("FlagNames = %q, want %q", got, want)
	}
}
