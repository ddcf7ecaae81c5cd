// Command funcsize keeps product functions small: it reports every
// function declaration over a line limit (default 80) or over a cyclomatic
// complexity limit (default 15) in the non-test, non-generated Go files
// under the directories it is given, and checks the result against an
// allowlist so that the list of exceptions can only shrink.
//
// Usage:
//
//	funcsize [-lines 80] [-complexity 15] [-allow FILE] [-write] DIR...
//
// Without -allow it prints the violations and exits 1 if there are any.
// With -allow it exits 1 when
//
//   - a function violates a limit and is not in the list,
//   - a listed function is worse than its entry (more lines, or higher
//     complexity, than listed, where that is over the limit), or
//   - a listed function no longer violates either limit, or no longer
//     exists (the entry is stale: delete it).
//
// -write rewrites FILE from today's violations instead of checking; use it
// only to record the starting point, since every entry is an exception
// that review should see being added.
//
// What is measured:
//
//   - A function is an *ast.FuncDecl (functions and methods). A function
//     literal is part of the declaration that contains it: its lines and
//     its branches count against that function, as they do in gocyclo, so
//     moving code into a closure does not make a function smaller. A
//     literal at package level (var f = func...) is not measured; there
//     are none worth a rule.
//   - Lines run from the line of the func keyword to the line of the
//     closing brace, both included (the doc comment is not counted).
//   - Cyclomatic complexity is computed as github.com/fzipp/gocyclo v0.6.0
//     does: 1, plus 1 for each if, for, range, non-default case clause,
//     non-default select clause, && and ||, anywhere in the body
//     (closures included).
//   - Skipped: _test.go files, .pb.go files, files marked "Code generated
//     ... DO NOT EDIT.", and directories named testdata or vendor or
//     starting with "." or "_".
//
// The allowlist has one function a line, "LINES COMPLEXITY DIR NAME", for
// example "117 28 observe/bottleneck Compute" or
// "52 20 launcher (*supervisor).judge"; DIR is the package directory
// relative to the working directory, NAME is gocyclo's spelling of the
// function. Blank lines and lines starting with # are ignored.
package main
