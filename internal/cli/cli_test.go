package cli

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestHelpGoesToStdout(t *testing.T) {
	fs := NewFlagSet("prog", "cmd", "cmd [flags] DIR", "Does a thing.")
	fs.Int("n", 3, "how many")
	var out bytes.Buffer
	if err := Parse(fs, []string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h) = %v, want flag.ErrHelp", err)
	}
	got := out.String()
	for _, want := range []string{"usage: prog cmd [flags] DIR\n\nDoes a thing.\n", "\nflags:\n", "-n int", "how many (default 3)"} {
		if !strings.Contains(got, want) {
			t.Errorf("help lacks %q:\n%s", want, got)
		}
	}
}

func TestHelpWithoutFlagsHasNoFlagList(t *testing.T) {
	fs := NewFlagSet("prog", "cmd", "cmd", "About.")
	var out bytes.Buffer
	if err := Parse(fs, []string{"-help"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-help) = %v, want flag.ErrHelp", err)
	}
	if got, want := out.String(), "usage: prog cmd\n\nAbout.\n"; got != want {
		t.Errorf("help = %q, want %q", got, want)
	}
}

func TestMistakeIsReturnedNotPrinted(t *testing.T) {
	fs := NewFlagSet("prog", "cmd", "cmd", "About.")
	n := fs.Int("n", 0, "")
	var out bytes.Buffer
	err := Parse(fs, []string{"-n", "x"}, &out)
	if err == nil || errors.Is(err, flag.ErrHelp) || !strings.Contains(err.Error(), "-n") {
		t.Fatalf("Parse(-n x) = %v, want the flag package's error about -n", err)
	}
	if out.Len() > 0 {
		t.Errorf("a mistake printed %q", out.String())
	}
	if err := Parse(fs, []string{"-n", "7", "rest"}, &out); err != nil || *n != 7 || fs.Arg(0) != "rest" {
		t.Errorf("Parse(-n 7 rest) = %v, n %d, args %v", err, *n, fs.Args())
	}
}
