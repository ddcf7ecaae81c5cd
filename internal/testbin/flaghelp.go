package testbin

import (
	"regexp"
	"strings"
)

// flagHead is a flag's first line in a command's -h output: "  -name"
// and what follows it, which Go's flag package takes from a backquoted
// word in the usage string or else from the flag's type.
var flagHead = regexp.MustCompile(`(?m)^  -([a-z0-9.-]+)(?: ([^\t\n]*))?$`)

// argNames are the words a flag line may show after the name: the flag
// package's type names and the argument names pstrain's usage strings give.
var argNames = map[string]bool{"": true, "int": true, "uint": true, "float": true, "string": true, "duration": true, "value": true,
	"N": true, "FILE": true, "DIR": true, "ADDR": true, "SPEC": true, "PATH": true}

// FlagNames returns the flag names of a command's -h output, in order.
func FlagNames(help string) []string {
	var out []string
	for _, m := range flagHead.FindAllStringSubmatch(help, -1) {
		out = append(out, m[1])
	}
	return out
}

// BadFlagLines returns the flag lines of a command's -h output whose name
// is followed by something that is not a type or an argument name: a
// usage string's backquotes taken for the value's name, as in
// "-max-workers pstrain scale".
func BadFlagLines(help string) []string {
	var bad []string
	for _, m := range flagHead.FindAllStringSubmatch(help, -1) {
		if !argNames[m[2]] {
			bad = append(bad, strings.TrimSpace(m[0]))
		}
	}
	return bad
}
